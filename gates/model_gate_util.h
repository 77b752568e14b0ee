// gates/model_gate_util.h: shared pieces of the model gates (gates/model_gates.cc): the HF
// reference fixtures (generated on the runner by gates/hf/make_refs.py the first time a gate
// needs them; a failure to make them FAILS the gate), the CUDA device fixture (no GPU is a
// failure, never a skip), a recording device wrapper, hand-built plans over bound pools, and
// an engine driver that collects tokens and terminals.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "gates/gpu_required.h"
#include "kernels/cuda_device.h"
#include "kernels/oracle_forward.h"

#ifndef TWINSTEP_SOURCE_DIR
#error "TWINSTEP_SOURCE_DIR must be defined by the build"
#endif
#ifndef TWINSTEP_BINARY_DIR
#error "TWINSTEP_BINARY_DIR must be defined by the build"
#endif

namespace twinstep::gates {

namespace fs = std::filesystem;
using nlohmann::json;

inline constexpr const char* kGeometries[] = {"g12b", "gsoft"};

// The fixtures directory, made by make_refs.py on first use (and again when the script is
// newer than its output). Returns an error message, or "" when the fixtures are there.
inline std::string ensure_hf_refs(fs::path* dir_out) {
  const fs::path dir = fs::path(TWINSTEP_BINARY_DIR) / "hf_refs";
  const fs::path script = fs::path(TWINSTEP_SOURCE_DIR) / "gates" / "hf" / "make_refs.py";
  const fs::path done = dir / "summary.json";
  *dir_out = dir;
  std::error_code ec;
  if (fs::exists(done, ec) && fs::last_write_time(done, ec) >= fs::last_write_time(script, ec)) {
    bool complete = true;
    for (const char* g : kGeometries) complete = complete && fs::exists(dir / g / "refs.json");
    if (complete) return "";
  }
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  const std::string log = (dir / "make_refs.log").string();
  const std::string cmd =
      "python3 '" + script.string() + "' --out '" + dir.string() + "' > '" + log + "' 2>&1";
  std::fprintf(stderr, "[model gates] generating HF references: %s\n", cmd.c_str());
  const int rc = std::system(cmd.c_str());
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "%s\n", text.c_str());
  if (rc != 0) {
    fs::remove(done, ec);
    return "make_refs.py failed (exit " + std::to_string(rc) +
           "); the HF fixtures are missing, "
           "which fails the gate. Log:\n" +
           text.substr(text.size() > 4000 ? text.size() - 4000 : 0);
  }
  return "";
}

struct HfPrompt {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // kept greedy continuation
  std::vector<double> margins;
};

struct HfRefs {
  std::string geometry;
  fs::path dir;
  json raw;
  double noise = 0;
  double margin_gate = 0;
  double logit_tol = 0;
  std::vector<HfPrompt> prompts;
};

inline HfRefs load_refs(const fs::path& root, const std::string& geometry) {
  HfRefs r;
  r.geometry = geometry;
  r.dir = root / geometry;
  std::ifstream in(r.dir / "refs.json");
  r.raw = json::parse(in, nullptr, false);
  if (r.raw.is_discarded()) return r;
  r.noise = r.raw["noise"];
  r.margin_gate = r.raw["margin_gate"];
  r.logit_tol = r.raw["logit_tol"];
  for (const json& p : r.raw["prompts"]) {
    r.prompts.push_back({p["prompt"].get<std::vector<int32_t>>(),
                         p["tokens"].get<std::vector<int32_t>>(),
                         p["margins"].get<std::vector<double>>()});
  }
  return r;
}

// Small pages and small steps, so the tiny models' prompts (>= 32 tokens, windows 16/24) are
// prefilled in several chunks, span many pages, and release pages behind the window.
inline engine::EngineConfig tiny_engine_config() {
  engine::EngineConfig ec;
  ec.page_size = 8;
  ec.pages_global = 512;
  ec.pages_local = 512;
  ec.max_running = 16;
  ec.max_step_tokens = 48;
  return ec;
}

inline std::unique_ptr<engine::Engine> make_engine(const engine::ModelConfig& config,
                                                   const engine::EngineConfig& ec,
                                                   engine::Device& d) {
  auto e = engine::Engine::create(config, ec, d);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  return e.ok() ? std::move(e.value()) : nullptr;
}

// Token ids as "1,2,3" (readable gate failures).
inline std::string ids(const std::vector<int32_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

// No GPU is a failure, never a skip.
class ModelGate : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(gates::require_gpu()); }
  // HF fixtures for `geometry`; a failure to make or read them fails the gate.
  HfRefs refs(const std::string& geometry) {
    fs::path root;
    const std::string error = ensure_hf_refs(&root);
    EXPECT_EQ(error, "");
    HfRefs r = load_refs(root, geometry);
    EXPECT_FALSE(r.raw.is_discarded()) << "cannot read " << (r.dir / "refs.json");
    EXPECT_GE(r.prompts.size(), 3u) << geometry << ": fewer than 3 reference prompts";
    return r;
  }
  std::unique_ptr<engine::ModelWeights> load(const HfRefs& r) {
    auto w = engine::ModelWeights::load(r.dir);
    EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.error().message);
    return w.ok() ? std::move(w.value()) : nullptr;
  }
  std::unique_ptr<kernels::CudaDevice> device(const engine::ModelConfig& config,
                                              const engine::ModelWeights* weights,
                                              kernels::CudaDeviceOptions options = {}) {
    auto d = kernels::CudaDevice::create(config, weights, options);
    EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
    return d.ok() ? std::move(d.value()) : nullptr;
  }
};

// Forwards to a CUDA device and keeps what each step was asked and produced.
class RecordingDevice final : public engine::Device {
 public:
  explicit RecordingDevice(kernels::CudaDevice& inner) : inner_(inner) {}
  std::string name() const override { return "recording:" + inner_.name(); }
  Status<engine::DeviceError> bind(const engine::PoolLayout& g,
                                   const engine::PoolLayout& l) override {
    layouts_[0] = g;
    layouts_[1] = l;
    return inner_.bind(g, l);
  }
  Result<engine::DeviceOutput, engine::DeviceError> execute(const engine::StepPlan& plan) override {
    last_plan_ = plan;
    auto out = inner_.execute(plan);
    last_ok_ = out.ok();
    return out;
  }
  const engine::StepPlan& last_plan() const { return last_plan_; }
  bool last_ok() const { return last_ok_; }
  kernels::CudaDevice& inner() { return inner_; }

 private:
  kernels::CudaDevice& inner_;
  engine::PoolLayout layouts_[2];
  engine::StepPlan last_plan_;
  bool last_ok_ = false;
};

// Everything the engine said about one request.
struct Outcome {
  std::vector<int32_t> tokens;
  std::optional<engine::Terminal> terminal;
};

// Steps until idle (or max_steps), collecting tokens and terminals; `after_step` sees each
// step's outputs. Fails the gate on a violated engine invariant.
template <class F>
std::map<engine::RequestId, Outcome> drive(engine::Engine& e, int max_steps, F&& after_step) {
  std::map<engine::RequestId, Outcome> out;
  for (int i = 0; i < max_steps && !e.idle(); ++i) {
    const engine::StepOutputs step = e.step();
    for (const engine::RequestUpdate& u : step.updates) {
      Outcome& o = out[u.id];
      o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.terminal) o.terminal = *u.terminal;
    }
    const auto broken = e.check_invariants();
    EXPECT_TRUE(broken.empty()) << "step " << step.step_index << ": " << broken.front();
    if (!broken.empty()) break;
    after_step(step);
  }
  EXPECT_TRUE(e.idle()) << "the engine did not drain in " << max_steps << " steps";
  return out;
}
inline std::map<engine::RequestId, Outcome> drive(engine::Engine& e, int max_steps = 10000) {
  return drive(e, max_steps, [](const engine::StepOutputs&) {});
}

inline engine::Request greedy_request(std::vector<int32_t> prompt, int32_t max_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

// A hand-built prefill plan over bound pools: each seq is prefilled from position 0 in one
// step, its pages taken consecutively from `first_page` (per family), every seq produces
// logits in the order given. For direct-device gates that must control row order.
inline engine::StepPlan prefill_plan(const engine::ModelConfig& config,
                                     const engine::PoolLayout& global,
                                     const engine::PoolLayout& local,
                                     const std::vector<std::vector<int32_t>>& seqs,
                                     uint32_t first_page = 1) {
  engine::StepPlan p;
  p.page_size = global.page_size;
  p.sliding_window = config.sliding_window;
  uint32_t next[2] = {first_page, first_page};
  for (engine::Family f : engine::kFamilies) {
    p.family(f).family = f;
    p.family(f).pool = (f == engine::Family::kGlobal ? global : local).tag;
    p.family(f).seq_page_begin.push_back(0);
  }
  for (size_t s = 0; s < seqs.size(); ++s) {
    engine::PlanSeq seq;
    seq.request = engine::RequestId{s + 1};
    seq.row_begin = p.num_rows();
    seq.row_count = static_cast<int32_t>(seqs[s].size());
    seq.kv_len_before = 0;
    seq.logits_index = static_cast<int32_t>(s);
    const int32_t pages = (seq.row_count + p.page_size - 1) / p.page_size;
    for (engine::Family f : engine::kFamilies) {
      engine::FamilyPlan& fp = p.family(f);
      const uint32_t base = next[static_cast<int>(f)];
      for (int32_t i = 0; i < pages; ++i) fp.page_indices.push_back(base + i);
      fp.seq_page_begin.push_back(static_cast<int32_t>(fp.page_indices.size()));
      fp.seq_page_count.push_back(pages);
      fp.seq_first_page.push_back(0);
      for (int32_t pos = 0; pos < seq.row_count; ++pos) {
        fp.row_slot.push_back(int64_t{base + pos / p.page_size} * p.page_size + pos % p.page_size);
      }
      next[static_cast<int>(f)] += pages;
    }
    for (int32_t pos = 0; pos < seq.row_count; ++pos) {
      p.tokens.push_back(seqs[s][pos]);
      p.positions.push_back(pos);
      p.row_seq.push_back(static_cast<int32_t>(s));
    }
    p.seqs.push_back(seq);
  }
  p.num_logits = static_cast<int32_t>(seqs.size());
  return p;
}

inline engine::PoolLayout layout_for(const engine::ModelConfig& c, engine::Family f,
                                     int32_t page_size, int32_t pages_total, uint32_t tag) {
  engine::PoolLayout l;
  l.family = f;
  l.tag = engine::PoolTag{tag};
  l.page_size = page_size;
  l.kv_heads = c.family(f).kv_heads;
  l.head_dim = c.family(f).head_dim;
  l.layers = c.family(f).num_layers;
  l.pages_total = pages_total;
  return l;
}

// max |a - b| over a row, and the top1 - top2 margin and argmax of a row.
inline double max_abs_diff(const float* a, const float* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}
inline int32_t row_argmax(const float* x, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = static_cast<int32_t>(i);
  }
  return best;
}
inline double row_margin(const float* x, int64_t n) {
  double top1 = -INFINITY, top2 = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > top1) {
      top2 = top1;
      top1 = x[i];
    } else if (x[i] > top2) {
      top2 = x[i];
    }
  }
  return top1 - top2;
}

}  // namespace twinstep::gates
