// apps/twinstep_generate.cc: twinstep-generate, greedy (or sampled) generation of token ids
// through the real scheduler on the CUDA device or the simulated one. All prompts are
// submitted at once and batched by the scheduler; one output line per prompt, in order.
//
//   twinstep-generate --model DIR|PRESET --prompt-ids 2,17,99[;5,6,7...] --max-tokens N
//                     [--device cuda|sim] [--random-weights] [--seed S] [--ignore-eos]
//                     [--eager] [--batch-invariant]
//                     [--tensor-parallel N [--tp-transport nccl|loopback]]
//                     [--temperature T --top-k K --top-p P --sample-seed S]
//                     [--page-size P] [--max-step-tokens N]
//   twinstep-generate --model ... --tokenizer DIR|tokenizer.json --prompt TEXT [--prompt ...]
//                     [--chat [--system TEXT]] --max-tokens N ...
// With --tokenizer the output is text (text/: HF tokenizer.json, Gemma chat template).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "apps/generate_options.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/engine.h"
#include "sim/sim_device.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#if defined(TWINSTEP_WITH_CUDA)
#include "kernels/cuda_device.h"
#include "kernels/tp_device.h"
#endif

namespace {

using namespace twinstep;

using Options = apps::GenerateOptions;

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "twinstep-generate: %s\n%s", message.c_str(), apps::kGenerateUsage);
  std::exit(2);
}

#if defined(TWINSTEP_WITH_CUDA)
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

Options parse_args(int argc, char** argv) {
  auto parsed =
      apps::parse_generate_args(std::vector<std::string>(argv + 1, argv + argc), kWithCuda);
  if (!parsed) usage_error(parsed.error());
  if (parsed.value().help) {
    std::fputs(apps::kGenerateUsage, stdout);
    std::exit(0);
  }
  return std::move(parsed.value());
}

int32_t ceil_div(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

// An operating error (a bad tokenizer, config, checkpoint or device): the reason, exit 1.
[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "twinstep-generate: %s\n", message.c_str());
  std::exit(1);
}

// Text in: the tokenizer (and, with --chat, the chat template) of --tokenizer.
struct TextSide {
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat;
  std::vector<int32_t> stop_ids;  // the end-of-turn token with --chat
};

TextSide load_text(const Options& o) {
  TextSide side;
  if (o.tokenizer.empty()) return side;
  auto files = text::find_tokenizer_files(o.tokenizer);
  if (!files) fail("--tokenizer: " + files.error().message);
  auto t = text::Tokenizer::from_file(files->tokenizer_json);
  if (!t) fail("--tokenizer: " + t.error().message);
  side.tokenizer.emplace(std::move(t.value()));
  if (!o.chat) return side;
  if (files->tokenizer_config_json.empty()) {
    fail("--chat: no tokenizer_config.json beside " + files->tokenizer_json.string());
  }
  auto c = text::ChatTemplate::from_config_file(files->tokenizer_config_json);
  if (!c)
    fail(std::string("--chat: ") + text::chat_error_name(c.error().code) + ": " +
         c.error().message);
  side.chat.emplace(std::move(c.value()));
  for (const std::string& s : side.chat->end_of_turn()) {
    if (const auto id = side.tokenizer->token_to_id(s)) side.stop_ids.push_back(*id);
  }
  return side;
}

// --prompt TEXT as ids: encoded with the post-processor (<bos>), or, with --chat, rendered as
// a user turn (after --system) with the generation prompt and encoded as it is.
std::vector<std::vector<int32_t>> text_prompt_ids(const Options& o, const TextSide& side) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : o.text_prompts) {
    if (!side.chat) {
      prompts.push_back(side.tokenizer->encode(p, /*add_special_tokens=*/true));
    } else {
      nlohmann::json messages = nlohmann::json::array();
      if (o.system) messages.push_back({{"role", "system"}, {"content", *o.system}});
      messages.push_back({{"role", "user"}, {"content", p}});
      auto rendered = side.chat->render(messages, /*add_generation_prompt=*/true);
      if (!rendered)
        fail(std::string("--chat: ") + text::chat_error_name(rendered.error().code) + ": " +
             rendered.error().message);
      prompts.push_back(side.tokenizer->encode(*rendered, /*add_special_tokens=*/false));
    }
    if (prompts.back().empty()) usage_error("--prompt '" + p + "' encodes to no tokens");
  }
  return prompts;
}

// Text out: a detokenizer per prompt, special tokens (the stop token) left out. One prompt
// streams its text as the steps produce it.
class TextOutput {
 public:
  TextOutput(const TextSide& side, const std::vector<engine::RequestId>& ids)
      : stream_(side.tokenizer && ids.size() == 1) {
    if (!side.tokenizer) return;
    for (engine::RequestId id : ids) {
      detokenizers_.emplace(id, text::Detokenizer(*side.tokenizer, {.skip_special_tokens = true}));
    }
  }
  bool active() const { return !detokenizers_.empty(); }
  void on_tokens(engine::RequestId id, std::span<const int32_t> tokens) {
    const auto d = detokenizers_.find(id);
    if (d == detokenizers_.end()) return;
    for (const int32_t token : tokens) d->second.push_into(token, texts_[id]);
    if (stream_) write(std::exchange(texts_[id], {}));
  }
  // The rest of the prompt's text, then a newline.
  void print(engine::RequestId id) { write(texts_[id] + detokenizers_.at(id).finish() + "\n"); }

 private:
  static void write(const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  }
  bool stream_;
  std::map<engine::RequestId, text::Detokenizer> detokenizers_;
  std::map<engine::RequestId, std::string> texts_;
};

// The model: a checkpoint directory (config + shards), or its config alone / a preset with
// --random-weights. A bad one ends the run with exit 1 and the reason.
struct Model {
  engine::ModelConfig config;
  std::unique_ptr<engine::ModelWeights> weights;  // null: random weights or the sim device
};

Model load_model(const Options& o) {
  Model m;
  if (!std::filesystem::is_directory(o.model)) {
    auto c = engine::ModelConfig::preset(o.model);
    if (!c) {
      fail("--model '" + o.model + "' is neither a directory nor a preset: " + c.error().message);
    }
    if (o.device == "cuda" && !o.random_weights) {
      usage_error("preset '" + o.model + "' has no weights: add --random-weights");
    }
    m.config = c.value();
    return m;
  }
  if (o.random_weights || o.device == "sim") {
    auto c = engine::ModelConfig::from_file(std::filesystem::path(o.model) / "config.json");
    if (!c) fail(c.error().message);  // from_file names the file
    m.config = c.value();
    return m;
  }
  auto w = engine::ModelWeights::load(o.model);
  if (!w) fail(w.error().message);
  m.weights = std::move(w.value());
  m.config = m.weights->config();
  return m;
}

// Pools sized so that every prompt fits at once: the global family holds whole contexts; the
// local family holds as much (the scheduler releases pages behind the window as it goes).
engine::EngineConfig engine_config(const Options& o) {
  engine::EngineConfig ec;
  ec.page_size = o.page_size;
  int64_t pages = 0;
  for (const auto& p : o.prompts)
    pages += ceil_div(static_cast<int64_t>(p.size()) + o.max_tokens, o.page_size);
  ec.pages_global = static_cast<int32_t>(pages + 1);
  ec.pages_local = static_cast<int32_t>(pages + 1);
  ec.max_running = static_cast<int32_t>(o.prompts.size());
  ec.max_step_tokens = o.max_step_tokens;
  ec.batch_invariant = o.batch_invariant;
  return ec;
}

std::unique_ptr<engine::Device> make_device(const Options& o, const Model& m,
                                            const engine::EngineConfig& ec) {
  if (o.device == "sim") return std::make_unique<sim::SimDevice>(m.config);
#if defined(TWINSTEP_WITH_CUDA)
  kernels::CudaDeviceOptions dopt;
  dopt.random_seed = o.seed;
  dopt.batch_invariant = ec.batch_invariant;
  if (o.tensor_parallel > 1) {  // eager decode: no graphs under tensor parallelism (yet)
    kernels::TpDeviceOptions topt;
    topt.ranks = o.tensor_parallel;
    topt.transport = o.tp_transport == "loopback" ? kernels::TpTransport::kLoopback
                                                  : kernels::TpTransport::kNccl;
    topt.rank_options = dopt;
    auto tp = kernels::TensorParallelDevice::create(m.config, m.weights.get(), topt);
    if (!tp) fail("cuda device: " + tp.error().message);
    return std::move(tp.value());
  }
  auto d = kernels::CudaDevice::create(m.config, m.weights.get(), dopt);
  if (!d) fail("cuda device: " + d.error().message);
  if (!o.eager) {
    // Decode steps replay a CUDA graph per batch bucket (kernels/decode_graphs.h).
    kernels::DecodeGraphConfig g;
    g.max_step_rows = ec.max_step_tokens;
    g.max_logits = ec.max_running;
    int64_t longest = 1;
    for (const auto& p : o.prompts) {
      longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()) + o.max_tokens);
    }
    g.max_context = static_cast<int32_t>(std::min<int64_t>(longest, INT32_MAX));
    g.page_size = ec.page_size;
    if (auto s = d.value()->enable_decode_graphs(g); !s.ok()) {
      fail("decode graphs: " + s.error().message);
    }
  }
  return std::move(d.value());
#else
  (void)ec;
  usage_error("this build has no CUDA: use --device sim");
#endif
}

// Submits every prompt, steps until idle, then prints one line a prompt in order (ids, or text
// with --tokenizer). Returns the exit code: 1 if a prompt was rejected or failed, or more than
// 8 steps failed.
int generate(engine::Engine& e, const Options& o, const engine::ModelConfig& config,
             const TextSide& text_side) {
  std::vector<engine::RequestId> ids;
  for (const auto& p : o.prompts) {
    engine::Request r;
    r.prompt = p;
    r.max_tokens = o.max_tokens;
    r.sampling = o.sampling;
    if (!o.ignore_eos) r.stop_ids = config.eos_token_ids;
    r.stop_ids.insert(r.stop_ids.end(), text_side.stop_ids.begin(), text_side.stop_ids.end());
    ids.push_back(e.submit(std::move(r)).id());
  }
  TextOutput text_out(text_side, ids);
  std::map<engine::RequestId, std::vector<int32_t>> out;
  std::map<engine::RequestId, engine::Terminal> terminal;
  int failed_steps = 0;
  while (!e.idle()) {
    const engine::StepOutputs step = e.step();
    if (step.failed) {
      std::fprintf(stderr, "twinstep-generate: step %llu failed: %s\n",
                   static_cast<unsigned long long>(step.step_index), step.error.c_str());
      if (++failed_steps > 8) return 1;
    }
    for (const engine::RequestUpdate& u : step.updates) {
      auto& tokens = out[u.id];
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.terminal) terminal[u.id] = *u.terminal;
      text_out.on_tokens(u.id, u.new_tokens);
    }
  }
  int rc = 0;
  for (engine::RequestId id : ids) {
    const auto it = terminal.find(id);
    if (it != terminal.end() && (it->second.kind == engine::TerminalKind::kRejected ||
                                 it->second.kind == engine::TerminalKind::kFailed)) {
      std::fprintf(stderr, "twinstep-generate: prompt %llu: %s: %s\n",
                   static_cast<unsigned long long>(id.value),
                   engine::terminal_kind_name(it->second.kind), it->second.message.c_str());
      rc = 1;
    }
    if (text_out.active()) {
      text_out.print(id);
      continue;
    }
    const auto& tokens = out[id];
    std::string line;
    for (size_t i = 0; i < tokens.size(); ++i) line += (i ? "," : "") + std::to_string(tokens[i]);
    std::printf("%s\n", line.c_str());
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  const TextSide text_side = load_text(o);
  if (!o.text_prompts.empty()) o.prompts = text_prompt_ids(o, text_side);
  const Model model = load_model(o);
  const engine::EngineConfig ec = engine_config(o);
  const std::unique_ptr<engine::Device> device = make_device(o, model, ec);
  auto engine = engine::Engine::create(model.config, ec, *device);
  if (!engine) fail("engine: " + engine.error().message);
  return generate(*engine.value(), o, model.config, text_side);
}
