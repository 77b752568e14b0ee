// gates/tp_throughput_bench.cc: tensor parallelism's throughput against one GPU (issue 17), not a
// test. The 12B geometry with random weights (each rank's own: a benchmark needs shapes, not one
// model's values), behind the engine: a prefill step of 4 x 2048 prompt rows, then decode steps
// at batch 1, 16 and 64 over ~1k-token contexts, eager on both sides (decode graphs are not built
// under tensor parallelism), then the unsplit device's graph replays as the serving reference.
//
//   tp_throughput_bench [--ranks N] [--loopback]
//
// NCCL by default: rank r on GPU r, so N GPUs are needed (fewer is an error that says so).
// --loopback puts the N ranks on GPU 0 (kernels/tp_comm.h): they share its SMs and bandwidth,
// so its figures show the cost of the split and its collectives, not a speed-up.
// TWINSTEP_TP_BENCH_MAX_BATCH caps the decode batches (an 80 GB card: 16 under --loopback).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/cuda_device.h"
#include "kernels/tp_device.h"

namespace {

using namespace twinstep;

[[noreturn]] void die(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::exit(1);
}

constexpr int kPrefillSeqs = 4;
constexpr int kPrefillLen = 2048;
constexpr int kDecodeContext = 1024;
constexpr int kDecodeSteps = 24;

engine::EngineConfig engine_config(int max_batch) {
  engine::EngineConfig ec;
  ec.page_size = 16;
  const int tokens = std::max(kPrefillSeqs * (kPrefillLen + 8), max_batch * (kDecodeContext + 64));
  ec.pages_global = tokens / ec.page_size + 2 * max_batch + 64;
  ec.pages_local = ec.pages_global;
  ec.max_running = std::max(max_batch, kPrefillSeqs);
  ec.max_step_tokens = kPrefillSeqs * kPrefillLen;
  return ec;
}

void submit(engine::Engine& e, std::mt19937_64& rng, int prompt_len, int max_tokens) {
  std::uniform_int_distribution<int32_t> token(3, e.model().vocab_size - 1);
  engine::Request r;
  r.prompt.push_back(e.model().bos_token_id);
  while (static_cast<int>(r.prompt.size()) < prompt_len) r.prompt.push_back(token(rng));
  r.max_tokens = max_tokens;  // no stop ids: random weights must not end a request early
  if (auto why = e.validate(r)) die("request refused: %s", why->message.c_str());
  e.submit(std::move(r));
}

// Wall milliseconds of one engine step (the devices synchronise before returning).
double timed_step(engine::Engine& e, engine::StepOutputs* out = nullptr) {
  const auto t0 = std::chrono::steady_clock::now();
  engine::StepOutputs o = e.step();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (o.failed)
    die("step %llu failed: %s", static_cast<unsigned long long>(o.step_index), o.error.c_str());
  if (out != nullptr) *out = std::move(o);
  return ms;
}

void drain(engine::Engine& e) {
  for (int i = 0; !e.idle(); ++i) {
    if (i > 20000) die("the engine did not drain");
    timed_step(e);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Figures {
  double prefill_ms = 0;          // the 8192-row step
  std::vector<double> decode_ms;  // per batch
};

// The prefill step (the second of two rounds: the first allocates), then per batch: the
// prompts prefilled, kDecodeSteps decode-only steps timed.
Figures measure(engine::Device& device, const engine::ModelConfig& config,
                const std::vector<int>& batches) {
  auto made = engine::Engine::create(config, engine_config(batches.back()), device);
  if (!made) die("engine: %s", made.error().message.c_str());
  engine::Engine& e = *made.value();
  std::mt19937_64 rng(7);
  Figures f;
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < kPrefillSeqs; ++s) submit(e, rng, kPrefillLen, 1);
    f.prefill_ms = timed_step(e);
    drain(e);
  }
  for (int batch : batches) {
    for (int s = 0; s < batch; ++s) submit(e, rng, kDecodeContext, kDecodeSteps + 8);
    std::vector<double> ms;
    for (int i = 0; i < 20000 && !e.idle() && static_cast<int>(ms.size()) < kDecodeSteps; ++i) {
      engine::StepOutputs out;
      const double t = timed_step(e, &out);
      bool decode_only = static_cast<int>(out.updates.size()) == batch;
      for (const engine::RequestUpdate& u : out.updates) {
        decode_only = decode_only && u.new_tokens.size() == 1 && u.kv_len > kDecodeContext;
      }
      if (decode_only) ms.push_back(t);
    }
    drain(e);
    f.decode_ms.push_back(median(ms));
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  int32_t ranks = 2;
  bool loopback = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--loopback") {
      loopback = true;
    } else {
      die("usage: tp_throughput_bench [--ranks N] [--loopback] (unknown argument '%s')", a.c_str());
    }
  }
  auto preset = engine::ModelConfig::preset("gemma4-12b");
  if (!preset) die("preset gemma4-12b: %s", preset.error().message.c_str());
  const engine::ModelConfig& config = preset.value();
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) die("no CUDA device");
  if (!loopback && gpus < ranks) {
    die("%d NCCL ranks need %d GPUs, %d visible (--loopback puts every rank on GPU 0)", ranks,
        ranks, gpus);
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::vector<int> batches = {1, 16, 64};
  if (const char* cap = std::getenv("TWINSTEP_TP_BENCH_MAX_BATCH")) {
    const int c = std::atoi(cap);
    std::erase_if(batches, [c](int b) { return b > c; });
    if (batches.empty()) die("TWINSTEP_TP_BENCH_MAX_BATCH=%s leaves no batch", cap);
  }
  std::printf("device: %s x%d visible; gemma4-12b random weights; TP=%d over %s\n", prop.name, gpus,
              ranks, loopback ? "the loopback clique on GPU 0 (NOT a speed-up)" : "NCCL");

  kernels::CudaDeviceOptions dopt;
  dopt.random_seed = 12;
  Figures one, split, graphs;
  {
    auto d = kernels::CudaDevice::create(config, nullptr, dopt);
    if (!d) die("cuda device: %s", d.error().message.c_str());
    one = measure(*d.value(), config, batches);
  }
  {
    kernels::TpDeviceOptions topt;
    topt.ranks = ranks;
    topt.transport = loopback ? kernels::TpTransport::kLoopback : kernels::TpTransport::kNccl;
    topt.rank_options = dopt;
    auto d = kernels::TensorParallelDevice::create(config, nullptr, topt);
    if (!d) die("tensor-parallel device: %s", d.error().message.c_str());
    split = measure(*d.value(), config, batches);
  }
  {
    auto d = kernels::CudaDevice::create(config, nullptr, dopt);
    if (!d) die("cuda device: %s", d.error().message.c_str());
    kernels::DecodeGraphConfig g;
    const engine::EngineConfig ec = engine_config(batches.back());
    g.max_step_rows = ec.max_step_tokens;
    g.max_logits = ec.max_running;
    g.max_context = kDecodeContext + kDecodeSteps + 64;
    g.page_size = ec.page_size;
    if (auto s = d.value()->enable_decode_graphs(g); !s.ok()) {
      die("decode graphs: %s", s.error().message.c_str());
    }
    graphs = measure(*d.value(), config, batches);
  }
  std::printf("| step | TP=1 eager ms | TP=%d eager ms | TP=1 / TP=%d | TP=1 graphs ms |\n", ranks,
              ranks);
  std::printf("|---|---|---|---|---|\n");
  std::printf("| prefill %dx%d | %.2f | %.2f | %.2f | %.2f |\n", kPrefillSeqs, kPrefillLen,
              one.prefill_ms, split.prefill_ms, one.prefill_ms / split.prefill_ms,
              graphs.prefill_ms);
  for (size_t i = 0; i < batches.size(); ++i) {
    std::printf("| decode b=%d ctx~%d | %.3f | %.3f | %.2f | %.3f |\n", batches[i], kDecodeContext,
                one.decode_ms[i], split.decode_ms[i], one.decode_ms[i] / split.decode_ms[i],
                graphs.decode_ms[i]);
  }
  return 0;
}
