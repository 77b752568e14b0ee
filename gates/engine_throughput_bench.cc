// gates/engine_throughput_bench.cc: serving throughput of the real CUDA engine (not a test).
// Builds the gemma4-12b geometry with seeded random weights on the device and drives
// engine::Engine::step (scheduler, plan upload, forward, greedy sampling) through:
//   1. prefill: 16 x 2048-token prompts, max_tokens 1, max_step_tokens 8192;
//   2. decode at batch 128, 64, 16, 1 over ~1024-token contexts (128 prompts prefilled once;
//      the batch is cut by aborting requests), median step time over 20 steps after warm-up;
//   3. long-context decode: batch 16 over 32768-token contexts (the global family reads all of
//      them, the local family its 1024-token window);
//   4. prefix cache: TTFT of waves of requests sharing 2048-token system prompts, with the
//      cache off and on (its own engines, after the rest);
//   5. the batch-invariant mode (issue 16): prefill and decode at 64 with the mode off and on
//      (its own engines, last; alone with --batch-invariant);
//   6. section 1's prefill with cuDNN's paged SDPA for the local layers off and on
//      (CudaDeviceOptions::cudnn_local_prefill; its own engines, before 5; alone with
//      --cudnn-prefill);
//   and a per-phase GPU breakdown (CUDA events at the forward's phase boundaries, through
//      kernels::set_forward_phase_observer) of one prefill step and one decode step at 64.
// Every case also prints its roofline floor: max(bytes / measured copy bandwidth,
// FLOPs / kPeakFlops) and measured / floor. Exits non-zero on any CUDA or engine error.
// With --records FILE (issue 10) it runs instead a calibration sweep (prefill of many sizes,
// decode at batch 1..128 over contexts 256..4096, chunked and mixed steps, a 16k-context
// case) and writes every step's plan shape and measured time there, for twinstep-cost-fit.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "gates/kernel_trace.h"
#include "kernels/attention_decode_split.h"
#include "kernels/cuda_device.h"
#include "kernels/decode_graphs.h"
#include "kernels/l2_prefetch.h"
#include "kernels/model_forward.h"
#include "sim/cost_model.h"

namespace {

using namespace twinstep;

// Dense bf16 tensor throughput assumed for the compute floor (the runner notes' figure for
// this H200); the bandwidth floor uses the copy bandwidth measured in this process.
constexpr double kPeakFlops = 790e12;
constexpr int kPageSize = 16;
constexpr int kDecodeMaxBatchDefault = 128;
constexpr int kDecodePrompt = 1024;
constexpr int kDecodeWarmup = 5;
constexpr int kDecodeTimed = 20;
constexpr int kLongBatch = 16;      // the long-context decode case
constexpr int kLongPrompt = 32768;  // tokens of context per request
// Enough that no request finishes before the last prompt is prefilled (~64 steps of 8192 rows)
// and the timed steps are done.
constexpr int kLongTokens = 160;
constexpr int kPrefillRequests = 16;
constexpr int kPrefillPrompt = 2048;
constexpr int kMaxStepTokens = 8192;

[[noreturn]] void die(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("engine_throughput_bench: error: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::exit(1);
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) die("%s: %s", what, cudaGetErrorString(err));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Device-to-device copy of 512 MiB, bytes read + written per copy; median of 11 after 3.
double measure_copy_bandwidth(cudaStream_t stream) {
  constexpr size_t kBytes = size_t{512} << 20;
  void* a = nullptr;
  void* b = nullptr;
  check_cuda(cudaMalloc(&a, kBytes), "cudaMalloc(copy src)");
  check_cuda(cudaMalloc(&b, kBytes), "cudaMalloc(copy dst)");
  check_cuda(cudaMemsetAsync(a, 1, kBytes, stream), "cudaMemsetAsync(copy src)");
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < 14; ++i) {
    check_cuda(cudaEventRecord(e0, stream), "cudaEventRecord");
    check_cuda(cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    check_cuda(cudaEventRecord(e1, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize(copy)");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  check_cuda(cudaFree(a), "cudaFree(copy src)");
  check_cuda(cudaFree(b), "cudaFree(copy dst)");
  return 2.0 * kBytes / (median(ms) * 1e-3);
}

// What one step must at least move and compute, from the geometry and the step's rows.
struct Cost {
  double flops = 0;
  double bytes = 0;
  Cost& operator+=(const Cost& o) {
    flops += o.flops;
    bytes += o.bytes;
    return *this;
  }
};

class CostModel {
 public:
  CostModel(const engine::ModelConfig& c, const kernels::DeviceModel& m, double bandwidth)
      : c_(c), weight_bytes_(static_cast<double>(m.arena_bytes())), bandwidth_(bandwidth) {
    const double H = c.hidden_size;
    const double I = c.intermediate_size;
    for (int32_t l = 0; l < c.num_layers; ++l) {
      const kernels::DeviceModel::Layer& L = m.layer(l);
      linear_params_ += L.qkv_cols * H + H * c.num_q_heads * L.head_dim + 3.0 * H * I;
    }
    lm_head_params_ = static_cast<double>(c.vocab_size) * H;
  }
  double linear_params() const { return linear_params_; }
  double weight_bytes() const { return weight_bytes_; }

  // `rows` rows at positions [end - rows, end) of one sequence; `logits` if it samples.
  // Weights are not included (once per step: step_cost adds them).
  Cost seq_cost(int64_t end, int64_t rows, bool logits) const {
    Cost cost;
    cost.flops = 2.0 * linear_params_ * rows + (logits ? 2.0 * lm_head_params_ : 0.0);
    for (int32_t l = 0; l < c_.num_layers; ++l) {
      const engine::Family f = c_.layer_types[l];
      const engine::FamilyGeometry& g = c_.family(f);
      const int64_t window = f == engine::Family::kLocal ? c_.sliding_window : 0;
      // Keys seen by the row at position p: p + 1, capped by the window.
      double keys = 0;
      for (int64_t p = end - rows; p < end; ++p) {
        keys += window > 0 ? std::min<int64_t>(p + 1, window) : p + 1;
      }
      // QK^T and PV: 2 FLOPs per multiply-add, head_dim each, per query head.
      cost.flops += 4.0 * c_.num_q_heads * g.head_dim * keys;
      // K and V (bf16) of the keys visible to the last row read once, the new rows written.
      const int64_t visible = window > 0 ? std::min<int64_t>(end, window) : end;
      const double per_token = 2.0 * 2.0 * g.kv_heads * g.head_dim;
      cost.bytes += per_token * (visible + rows);
    }
    return cost;
  }

  Cost step_cost(const engine::StepOutputs& step) const {
    Cost cost;
    cost.bytes = weight_bytes_;
    for (const engine::RequestUpdate& u : step.updates) {
      if (u.scheduled_tokens <= 0) continue;
      cost += seq_cost(u.kv_len, u.scheduled_tokens, !u.new_tokens.empty());
    }
    return cost;
  }

  double floor_ms(const Cost& cost) const {
    return 1e3 * std::max(cost.bytes / bandwidth_, cost.flops / kPeakFlops);
  }
  double memory_ms(const Cost& cost) const { return 1e3 * cost.bytes / bandwidth_; }
  double compute_ms(const Cost& cost) const { return 1e3 * cost.flops / kPeakFlops; }

 private:
  const engine::ModelConfig& c_;
  double weight_bytes_ = 0;
  double bandwidth_ = 0;
  double linear_params_ = 0;
  double lm_head_params_ = 0;
};

// Records a CUDA event at every phase boundary of the forward; after the step's sync, the time
// between consecutive events goes to the phase the earlier one opened.
class PhaseTimer final : public kernels::ForwardPhaseObserver {
 public:
  explicit PhaseTimer(int capacity) : events_(capacity), phases_(capacity) {
    for (cudaEvent_t& e : events_) check_cuda(cudaEventCreate(&e), "cudaEventCreate(phase)");
  }
  ~PhaseTimer() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void mark(kernels::ForwardPhase phase, cudaStream_t stream) override {
    if (count_ >= events_.size()) {
      overflow_ = true;
      return;
    }
    if (error_ == cudaSuccess) error_ = cudaEventRecord(events_[count_], stream);
    phases_[count_++] = phase;
  }
  // Per-phase milliseconds of the marks since the last reset; the stream must be synchronised.
  std::vector<double> phase_ms(double* total_ms) const {
    if (overflow_) die("phase timer: more than %zu marks in one step", events_.size());
    check_cuda(error_, "cudaEventRecord(phase)");
    if (count_ < 2) die("phase timer: %zu marks (the forward did not run?)", count_);
    std::vector<double> ms(kernels::kForwardPhaseCount, 0.0);
    for (size_t i = 0; i + 1 < count_; ++i) {
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, events_[i], events_[i + 1]), "cudaEventElapsedTime");
      ms[static_cast<int>(phases_[i])] += t;
    }
    float total = 0;
    check_cuda(cudaEventElapsedTime(&total, events_[0], events_[count_ - 1]),
               "cudaEventElapsedTime(total)");
    *total_ms = total;
    return ms;
  }
  void reset() {
    count_ = 0;
    overflow_ = false;
    error_ = cudaSuccess;
  }

 private:
  std::vector<cudaEvent_t> events_;
  std::vector<kernels::ForwardPhase> phases_;
  size_t count_ = 0;
  bool overflow_ = false;
  cudaError_t error_ = cudaSuccess;
};

const char* phase_name(int phase) {
  static const char* const kNames[kernels::kForwardPhaseCount] = {
      "embed",     "norms+residual", "qkv gemm",     "q/k norm+rope+kv write",
      "attention", "o_proj gemm",    "gate_up gemm", "gelu*up",
      "down gemm", "lm head",        "end"};
  return kNames[phase];
}

struct Timed {
  engine::StepOutputs out;
  double ms = 0;
};

// One engine step, wall-clock timed (the CUDA device synchronises its stream before step()
// returns). A failed step, a rejected or failed request or a preemption ends the program:
// every figure assumes the requests ran undisturbed.
Timed step(engine::Engine& e) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t;
  t.out = e.step();
  t.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (t.out.failed) {
    die("step %llu failed: %s", static_cast<unsigned long long>(t.out.step_index),
        t.out.error.c_str());
  }
  for (const engine::RequestUpdate& u : t.out.updates) {
    if (u.preempted) {
      die("request %llu preempted (pools too small)", static_cast<unsigned long long>(u.id.value));
    }
    if (u.terminal && (u.terminal->kind == engine::TerminalKind::kRejected ||
                       u.terminal->kind == engine::TerminalKind::kFailed)) {
      die("request %llu %s: %s", static_cast<unsigned long long>(u.id.value),
          engine::terminal_kind_name(u.terminal->kind), u.terminal->message.c_str());
    }
  }
  return t;
}

// TWINSTEP_BENCH_TRACE=1: one more step under a CUPTI kernel timeline (gates/kernel_trace.h),
// printed as kernels, busy / idle time and the kernels grouped by name.
bool trace_enabled() {
  static const bool on = std::getenv("TWINSTEP_BENCH_TRACE") != nullptr;
  return on;
}
void trace_step(engine::Engine& e, const std::string& title) {
  if (const std::string err = gates::KernelTrace::start(); !err.empty()) {
    std::printf("-- trace: %s: not taken: %s\n", title.c_str(), err.c_str());
    return;
  }
  const Timed t = step(e);
  const std::vector<gates::KernelRecord> kernels = gates::KernelTrace::stop();
  std::fputs(gates::trace_summary(title, kernels, t.ms).c_str(), stdout);
}

engine::RequestControl submit(engine::Engine& e, std::mt19937_64& rng, int prompt_len,
                              int max_tokens) {
  const int32_t vocab = e.model().vocab_size;
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  engine::Request r;
  r.prompt.reserve(prompt_len);
  r.prompt.push_back(e.model().bos_token_id);
  while (static_cast<int>(r.prompt.size()) < prompt_len) r.prompt.push_back(token(rng));
  r.max_tokens = max_tokens;  // no stop ids: random weights must not end a request early
  if (auto why = e.validate(r)) die("request refused: %s", why->message.c_str());
  return e.submit(std::move(r));
}

void drain(engine::Engine& e) {
  for (int i = 0; !e.idle(); ++i) {
    if (i > 10000) die("engine did not drain");
    step(e);
  }
}

struct Row {
  std::string name;
  double rows_per_step = 0;
  double ms_per_step = 0;
  double tokens_per_s = 0;
  double floor_mem_ms = 0;
  double floor_compute_ms = 0;
  double floor_ms = 0;
};

void print_breakdown(const char* title, const std::vector<double>& ms, double forward_ms,
                     double step_ms, double unobserved_ms) {
  std::printf("\n-- phase breakdown: %s --\n", title);
  std::printf("  %-26s %10s %7s\n", "phase", "ms", "%");
  for (int p = 0; p < kernels::kForwardPhaseCount; ++p) {
    if (p == static_cast<int>(kernels::ForwardPhase::kEnd)) continue;
    std::printf("  %-26s %10.3f %6.1f%%\n", phase_name(p), ms[p], 100.0 * ms[p] / forward_ms);
  }
  std::printf("  %-26s %10.3f\n", "forward (GPU, events)", forward_ms);
  std::printf("  %-26s %10.3f  (upload, argmax, sync, scheduler: step wall - forward)\n",
              "outside the forward", step_ms - forward_ms);
  std::printf("  %-26s %10.3f  (same step unobserved: %.3f ms)\n", "step wall, observed", step_ms,
              unobserved_ms);
}

// TWINSTEP_BENCH_PREFILL_REQUESTS: the prefill section's prompt count (default
// kPrefillRequests; a multiple of the four prompts a step holds, at most 256).
int prefill_request_count() {
  const char* v = std::getenv("TWINSTEP_BENCH_PREFILL_REQUESTS");
  if (v == nullptr) return kPrefillRequests;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  const int per_step = kMaxStepTokens / kPrefillPrompt;
  if (end == v || *end != '\0' || n < per_step || n > 256 || n % per_step != 0) {
    die("TWINSTEP_BENCH_PREFILL_REQUESTS=%s: expected a multiple of %d in [%d, 256]", v, per_step,
        per_step);
  }
  return static_cast<int>(n);
}

// TWINSTEP_BENCH_DECODE_MAX_BATCH: the decode section's largest batch, 128 (the default) or 64;
// the smaller batches of the table run below it, and the pools are sized for it. At 128 they
// need an H200's memory (the local pool alone is 57 GB); at 64 the bench fits an 80 GB H100,
// for A/B runs when no H200 is lent (figures of other cards are not the issues' targets). 16
// would leave the long-context prefill too few local pages.
int decode_max_batch() {
  const char* v = std::getenv("TWINSTEP_BENCH_DECODE_MAX_BATCH");
  if (v == nullptr) return kDecodeMaxBatchDefault;
  const std::string s = v;
  if (s != "128" && s != "64") die("TWINSTEP_BENCH_DECODE_MAX_BATCH=%s: expected 128 or 64", v);
  return std::stoi(s);
}

// One observed prefill step as a line: its wall-clock start (ms since the epoch), wall and
// forward time, and the phases that hold its time.
std::string observed_step_line(const PhaseTimer& timer, double start_epoch_ms, double wall_ms) {
  double forward_ms = 0;
  const std::vector<double> p = timer.phase_ms(&forward_ms);
  using P = kernels::ForwardPhase;
  const auto at = [&](P phase) { return p[static_cast<int>(phase)]; };
  char line[512];
  std::snprintf(line, sizeof line,
                "  OBSERVED start_epoch_ms %.1f wall %.3f forward %.3f | qkv %.2f q/k write %.2f "
                "attention %.2f o %.2f gate_up %.2f down %.2f norms %.2f lm %.2f",
                start_epoch_ms, wall_ms, forward_ms, at(P::kQkvGemm), at(P::kRopeKvWrite),
                at(P::kAttention), at(P::kOGemm), at(P::kGateUpGemm), at(P::kDownGemm),
                at(P::kNorms), at(P::kLmHead));
  return line;
}

}  // namespace

// The device of the bench's engine (its time_steps events give each step's GPU time).
kernels::CudaDevice* g_device = nullptr;

// The host path of the engine's last step (Scheduler::last_step_times,
// CudaDevice::last_host_phases), in microseconds, appended to ph: admit, plan, device check,
// stage, launch, wait, post, commit, and the step's wall time outside the scheduler. Section 2
// prints them for decode, section 1 for prefill (issue 12, session 6). Nothing without g_device.
void push_host_phases(engine::Engine& e, double step_ms, std::vector<double> (&ph)[10]) {
  if (g_device == nullptr) return;
  const engine::Scheduler::StepTimes& s = e.scheduler().last_step_times();
  const kernels::CudaDevice::HostPhases& d = g_device->last_host_phases();
  const double v[10] = {s.admit_us,
                        s.plan_us,
                        d.check_us,
                        d.stage_us,
                        d.launch_us,
                        d.wait_us,
                        d.post_us,
                        s.commit_us,
                        step_ms * 1e3 - (s.admit_us + s.plan_us + s.device_us + s.commit_us),
                        d.forward_setup_us};
  for (int p = 0; p < 10; ++p) ph[p].push_back(v[p]);
}

// Warm-up then kDecodeTimed pure decode steps of `batch` rows: prints the case and adds its
// row to the summary table; returns the median ms/step.
double time_decode(engine::Engine& e, const CostModel& cost, int batch, const std::string& name,
                   std::vector<Row>& table) {
  for (int i = 0; i < kDecodeWarmup; ++i) step(e);
  std::vector<double> ms, host;
  // Host time by phase (us): admit, plan, check, stage, launch, wait, post, commit, outside
  // the scheduler (Scheduler::last_step_times, CudaDevice::last_host_phases).
  std::vector<double> phases[10], graph_launch;
  Cost total_cost;
  int64_t context = 0;
  for (int i = 0; i < kDecodeTimed; ++i) {
    Timed t = step(e);
    if (t.out.rows != batch) die("decode at %d: a step had %d rows", batch, t.out.rows);
    ms.push_back(t.ms);
    if (g_device != nullptr) graph_launch.push_back(g_device->last_host_phases().graph_launch_us);
    if (g_device != nullptr) host.push_back(t.ms - g_device->last_step_gpu_ms());
    push_host_phases(e, t.ms, phases);
    total_cost += cost.step_cost(t.out);
    for (const auto& u : t.out.updates) context += u.kv_len;
  }
  const double med = median(ms);
  const Cost per_step{total_cost.flops / kDecodeTimed, total_cost.bytes / kDecodeTimed};
  std::printf("\n== decode batch %d: mean context %.0f tokens ==\n", batch,
              double(context) / (kDecodeTimed * batch));
  std::printf("  median %.3f ms/step (min %.3f, max %.3f over %d), %.0f generated tokens/s\n", med,
              *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()),
              kDecodeTimed, batch / (med * 1e-3));
  if (!host.empty()) {
    std::printf(
        "  host path (step wall - GPU time from plan upload to sampled ids): median %.3f "
        "ms; the bucket's launch call (cudaGraphLaunch, or the eager forward) median %.1f us\n",
        median(host), median(graph_launch));
    std::printf(
        "  host phases, median us: admit %.1f, plan %.1f, device: check %.1f, stage %.1f, "
        "launch %.1f, wait %.1f, post %.1f; commit %.1f, outside the scheduler %.1f\n",
        median(phases[0]), median(phases[1]), median(phases[2]), median(phases[3]),
        median(phases[4]), median(phases[5]), median(phases[6]), median(phases[7]),
        median(phases[8]));
  }
  std::printf("  bytes/step %.2f GB (weights %.2f + KV %.2f), FLOPs/step %.2f T\n",
              per_step.bytes / 1e9, cost.weight_bytes() / 1e9,
              (per_step.bytes - cost.weight_bytes()) / 1e9, per_step.flops / 1e12);
  std::printf("  floor: %.3f ms (memory %.3f, compute %.3f); measured/floor %.2f\n",
              cost.floor_ms(per_step), cost.memory_ms(per_step), cost.compute_ms(per_step),
              med / cost.floor_ms(per_step));
  table.push_back({name, double(batch), med, batch / (med * 1e-3), cost.memory_ms(per_step),
                   cost.compute_ms(per_step), cost.floor_ms(per_step)});
  return med;
}

// ==== Issue 10: per-step records for the simulator's calibration (--records FILE) ========
// Separate from the bench's own cases above: its own engine, its own sweep; only main()'s
// first lines branch here.
namespace cost_records {

struct Sweep {
  engine::Engine& e;
  sim::StepShapeRecorder& device;
  std::mt19937_64 rng{17};
  nlohmann::json records = nlohmann::json::array();

  // One timed step, recorded under `label` when it computed rows.
  engine::StepOutputs step(const std::string& label) {
    Timed t = ::step(e);
    if (t.out.rows > 0) {
      if (device.last.rows() != t.out.rows) {
        die("records: the recorded plan has %d rows, the step %d", device.last.rows(), t.out.rows);
      }
      records.push_back(
          {{"label", label}, {"measured_ms", t.ms}, {"shape", device.last.to_json()}});
    }
    return t.out;
  }
  void run_until_idle(const std::string& label) {
    for (int i = 0; !e.idle(); ++i) {
      if (i > 400) die("records: '%s' did not drain", label.c_str());
      step(label);
    }
  }
};

bool pure_decode(const engine::StepOutputs& out, int batch) {
  return out.rows == batch &&
         std::all_of(out.updates.begin(), out.updates.end(),
                     [](const engine::RequestUpdate& u) { return u.scheduled_tokens == 1; });
}

// Prefill steps of n x len rows (max_tokens 1: each group is one step), three of each.
void sweep_prefill(Sweep& s) {
  const int cases[][2] = {{1, 8192}, {2, 4096}, {4, 2048}, {1, 2048}, {8, 1024},
                          {2, 1024}, {16, 512}, {1, 512},  {32, 256}, {4, 256},
                          {64, 128}, {1, 128},  {1, 32}};
  for (const auto& c : cases) {
    const std::string label = "prefill " + std::to_string(c[0]) + "x" + std::to_string(c[1]);
    for (int rep = 0; rep < 3; ++rep) {
      for (int i = 0; i < c[0]; ++i) submit(s.e, s.rng, c[1], 1);
      s.run_until_idle(label);
    }
  }
}

// `top` requests of `context` tokens prefilled (mixed prefill + decode steps on the way), then
// 5 decode steps at each batch size from `top` down to 1 (cut by aborts). At context 1024 and
// batch 32, a 12000-token prompt arrives: chunked prefill beside 32 decode rows.
void sweep_decode(Sweep& s, int context, int top) {
  const std::string c = " c=" + std::to_string(context);
  std::vector<engine::RequestControl> controls;
  for (int i = 0; i < top; ++i) controls.push_back(submit(s.e, s.rng, context, 160));
  for (int i = 0; !pure_decode(s.step("prefill+decode" + c), top); ++i) {
    if (i > 200) die("records: decode setup at %d did not reach a pure decode step", context);
  }
  int live = top;
  for (const int batch : {128, 96, 64, 32, 16, 8, 4, 2, 1}) {
    if (batch > top) continue;
    for (int i = batch; i < live; ++i) controls[i].abort();
    live = batch;
    for (int k = 0; k < 5; ++k) s.step("decode b=" + std::to_string(batch) + c);
    if (context == 1024 && batch == 32) {
      controls.push_back(submit(s.e, s.rng, 12000, 1));
      for (int k = 0; k < 3; ++k) s.step("chunk 12000 + decode b=32" + c);
    }
  }
  for (auto& ctl : controls) ctl.abort();
  s.run_until_idle("drain" + c);
}

// 8 x 16384-token prompts (two 8192-row chunks each), then decode at 8, 4, 1.
void sweep_long(Sweep& s) {
  std::vector<engine::RequestControl> controls;
  for (int i = 0; i < 8; ++i) controls.push_back(submit(s.e, s.rng, 16384, 60));
  for (int i = 0; !pure_decode(s.step("chunked prefill 8x16k"), 8); ++i) {
    if (i > 100) die("records: the 16k setup did not reach a pure decode step");
  }
  int live = 8;
  for (const int batch : {8, 4, 1}) {
    for (int i = batch; i < live; ++i) controls[i].abort();
    live = batch;
    for (int k = 0; k < 5; ++k) s.step("decode b=" + std::to_string(batch) + " c=16k");
  }
  for (auto& ctl : controls) ctl.abort();
  s.run_until_idle("drain 16k");
}

// Decode batches of MIXED contexts (split-KV: the longest row's chunk is the critical path) at
// batch sizes that are graph buckets and ones padded to the next bucket, plus prefill beside a
// decode batch of mixed contexts (a 3000-token prompt in one step, a 9000-token one chunked),
// as the replay gate's workload has them. `n_long` rows of `long_ctx` tokens are submitted
// first, the rest `short_ctx`; aborts from the back keep the long rows to the end.
struct MixedCase {
  int n_long, long_ctx, short_ctx;
  std::vector<int> batches;  // descending, the first is the batch prefilled
  bool prefill_beside;       // at the batch below 40: a 3000 and a 9000 prompt arrive
};
void sweep_mixed(Sweep& s) {
  const MixedCase cases[] = {
      {1, 9000, 300, {56, 49, 41, 33, 25, 17, 12, 9, 5, 3, 2}, true},
      {2, 4096, 1024, {24, 20, 13, 7, 3}, false},
      {1, 16000, 512, {12, 9, 6, 3}, false},
      {8, 2048, 256, {100, 72, 40}, false},
  };
  for (const MixedCase& m : cases) {
    const std::string c = " long=" + std::to_string(m.n_long) + "x" + std::to_string(m.long_ctx) +
                          " short=" + std::to_string(m.short_ctx);
    std::vector<engine::RequestControl> controls;
    const int top = m.batches.front();
    for (int i = 0; i < top; ++i) {
      controls.push_back(submit(s.e, s.rng, i < m.n_long ? m.long_ctx : m.short_ctx, 200));
    }
    for (int i = 0; !pure_decode(s.step("prefill+decode mixed" + c), top); ++i) {
      if (i > 200) die("records: mixed setup%s did not reach a pure decode step", c.c_str());
    }
    int live = top;
    bool beside_done = !m.prefill_beside;
    for (const int batch : m.batches) {
      for (int i = batch; i < live; ++i) controls[i].abort();
      live = batch;
      for (int k = 0; k < 4; ++k) s.step("mixed decode b=" + std::to_string(batch) + c);
      if (!beside_done && batch < 40) {
        beside_done = true;
        for (const int len : {3000, 9000}) {
          submit(s.e, s.rng, len, 1);  // max_tokens 1: done when its prefill is
          const std::string label =
              "prefill " + std::to_string(len) + " + mixed decode b=" + std::to_string(batch);
          for (int k = 0; k < 4; ++k) {
            if (!pure_decode(s.step(label + c), batch)) continue;
            s.records.back()["label"] = "mixed decode b=" + std::to_string(batch) + c;
            break;
          }
        }
      }
    }
    for (auto& ctl : controls) ctl.abort();
    s.run_until_idle("drain mixed" + c);
  }
}

// The measured device's decode launch (sim/cost_model.h DecodeLaunch): the split policy's
// resident-block slots per family and the graph buckets the engine replays.
nlohmann::json decode_launch(const engine::ModelConfig& config, const cudaDeviceProp& prop,
                             const std::vector<int32_t>& buckets) {
  const int32_t sms = prop.multiProcessorCount;
  return {{"split_slots",
           {{"global", kernels::attention_decode_split_slots(config.global.head_dim, sms)},
            {"local", kernels::attention_decode_split_slots(config.local.head_dim, sms)}}},
          {"buckets", buckets}};
}

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

nlohmann::json provenance(const cudaDeviceProp& prop, const engine::EngineConfig& ec) {
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return {{"gpu", prop.name},
          {"sms", prop.multiProcessorCount},
          {"cuda_driver", driver},
          {"cuda_runtime", runtime},
          {"date", date},
          {"git_rev", env_or("TWINSTEP_GIT_REV", "unknown")},
          {"kernels", env_or("TWINSTEP_KERNELS", "unknown")},
          {"kernels_sha256", env_or("TWINSTEP_KERNELS_SHA256", "unknown")},
          {"bench", "engine_throughput_bench --records"},
          {"measured", "wall time of Engine::step(): scheduler, upload, forward, sampling, sync"},
          {"weights", "random bf16, seed 12"},
          {"decode_graphs", "on: decode-only steps replay a graph per batch bucket"},
          {"engine",
           {{"page_size", ec.page_size},
            {"max_running", ec.max_running},
            {"max_step_tokens", ec.max_step_tokens}}}};
}

int write_step_records(const engine::ModelConfig& config, kernels::CudaDevice& cuda,
                       const cudaDeviceProp& prop, const std::string& path) {
  sim::StepShapeRecorder device(cuda);
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  ec.max_running = 128;
  ec.max_step_tokens = kMaxStepTokens;
  // Decode-only steps replay CUDA graphs (DESIGN.md 2.6), captured before the pools exist.
  kernels::DecodeGraphConfig graphs;
  graphs.max_step_rows = ec.max_step_tokens;
  graphs.max_logits = ec.max_running;
  graphs.max_context = 16384 + 64 + kPageSize;  // the sweep's longest context
  graphs.page_size = ec.page_size;
  graphs.buckets = kernels::default_decode_buckets(ec.max_running);  // recorded below
  if (auto enabled = cuda.enable_decode_graphs(graphs); !enabled.ok()) {
    die("records: decode graphs: %s", enabled.error().message.c_str());
  }
  // Global: the largest resident set is 128 x ~2200 or 64 x ~4300 tokens; local: the window
  // (+ a page) per request and one step's chunk.
  ec.pages_global = 20000;
  ec.pages_local = 128 * (config.sliding_window / kPageSize + 6) + kMaxStepTokens / kPageSize;
  auto created = engine::Engine::create(config, ec, device);
  if (!created) die("records engine: %s", created.error().message.c_str());
  Sweep s{*created.value(), device};
  // Warm-up, not recorded: the largest step and the largest batch once.
  submit(s.e, s.rng, kMaxStepTokens, 1);
  drain(s.e);
  for (int i = 0; i < 128; ++i) submit(s.e, s.rng, 64, 6);
  drain(s.e);
  // Written after each section, so a failure late in the sweep keeps what was measured.
  const nlohmann::json prov = provenance(prop, ec);
  const nlohmann::json launch = decode_launch(config, prop, graphs.buckets);
  auto flush = [&](const char* section) {
    const nlohmann::json out = {{"format", "twinstep-step-records/1"},
                                {"model", "gemma4-12b"},
                                {"provenance", prov},
                                {"decode_launch", launch},
                                {"records", s.records}};
    std::ofstream file(path);
    file << out.dump(1) << "\n";
    if (!file) die("cannot write %s", path.c_str());
    std::printf("records: %s done, %zu steps so far in %s\n", section, s.records.size(),
                path.c_str());
  };
  sweep_prefill(s);
  flush("prefill");
  const std::pair<int, int> kContexts[] = {{256, 128}, {1024, 128}, {2048, 128}, {4096, 64}};
  for (const auto& [context, top] : kContexts) {
    sweep_decode(s, context, top);
    flush(("decode c=" + std::to_string(context)).c_str());
  }
  sweep_long(s);
  flush("16k context");
  sweep_mixed(s);
  flush("mixed contexts");
  const engine::DeviceStats ds = device.stats();
  std::printf("records: decode graphs: %llu replays, %llu eager decode steps (%llu misses)\n",
              static_cast<unsigned long long>(ds.graph_replays),
              static_cast<unsigned long long>(ds.graph_eager_decode_steps),
              static_cast<unsigned long long>(ds.graph_misses));
  return 0;
}

}  // namespace cost_records
// ==== end of issue 10's section ==========================================================

// ==== Issue 15: TTFT of a shared-system-prompt workload, prefix cache on and off ==========
// Its own devices and engines (the cache is an engine setting), made after the bench's own
// cases are done and their device is gone. 4 system prompts of kSystemTokens; kWaves waves of
// kWaveSize requests, each a system prompt plus kUserTokens of its own, max_tokens 4; a wave is
// submitted once the one before it has finished. TTFT: submit to the step that returned the
// request's first token (steps synchronise the device, so wall time is the GPU's too).
namespace prefix_ttft {

constexpr int kSystemPrompts = 4;
constexpr int kSystemTokens = 2048;
constexpr int kUserTokens = 64;
constexpr int kWaves = 4;
constexpr int kWaveSize = 16;

struct Result {
  std::vector<double> ttft_ms;        // every request of every wave
  std::vector<double> later_ttft_ms;  // waves 2.. (the cache is warm by then)
  uint64_t prompt_rows = 0;
  uint64_t hits = 0, hit_tokens = 0;
  double wall_ms = 0;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

Result run(const engine::ModelConfig& config, bool cache) {
  kernels::CudaDeviceOptions dopt;
  dopt.random_seed = 12;
  auto made = kernels::CudaDevice::create(config, nullptr, dopt);
  if (!made) die("prefix ttft: cuda device: %s", made.error().message.c_str());
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  const int pages = (kSystemTokens + kUserTokens + 16) / kPageSize + 1;
  ec.pages_global = (kWaveSize + 2 * kSystemPrompts) * pages;
  ec.pages_local = ec.pages_global;
  ec.max_running = kWaveSize;
  ec.max_step_tokens = kMaxStepTokens;
  ec.prefix_cache = cache;
  auto created = engine::Engine::create(config, ec, *made.value());
  if (!created) die("prefix ttft: engine: %s", created.error().message.c_str());
  engine::Engine& e = *created.value();
  std::mt19937_64 rng(99);
  const int32_t vocab = config.vocab_size;
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<std::vector<int32_t>> system(kSystemPrompts);
  for (auto& s : system) {
    s.push_back(config.bos_token_id);
    while (static_cast<int>(s.size()) < kSystemTokens) s.push_back(token(rng));
  }
  Result r;
  const auto t_all = std::chrono::steady_clock::now();
  for (int w = 0; w < kWaves; ++w) {
    std::map<uint64_t, std::chrono::steady_clock::time_point> submitted;
    for (int i = 0; i < kWaveSize; ++i) {
      engine::Request q;
      q.prompt = system[(w * kWaveSize + i) % kSystemPrompts];
      for (int j = 0; j < kUserTokens; ++j) q.prompt.push_back(token(rng));
      q.max_tokens = 4;
      if (auto why = e.validate(q)) die("prefix ttft: request refused: %s", why->message.c_str());
      const engine::RequestId id = e.submit(std::move(q)).id();
      submitted[id.value] = std::chrono::steady_clock::now();
    }
    for (int s = 0; !e.idle(); ++s) {
      if (s > 1000) die("prefix ttft: a wave did not drain");
      Timed t = step(e);
      const auto now = std::chrono::steady_clock::now();
      for (const engine::RequestUpdate& u : t.out.updates) {
        auto it = submitted.find(u.id.value);
        if (it == submitted.end() || u.new_tokens.empty()) continue;
        const double ms = std::chrono::duration<double, std::milli>(now - it->second).count();
        r.ttft_ms.push_back(ms);
        if (w > 0) r.later_ttft_ms.push_back(ms);
        submitted.erase(it);
      }
    }
    if (!submitted.empty()) die("prefix ttft: %zu requests got no token", submitted.size());
  }
  r.wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_all).count();
  const engine::Counters& c = e.metrics().counters;
  r.prompt_rows = c.prompt_tokens_computed;
  r.hits = c.prefix_hits;
  r.hit_tokens = c.prefix_hit_tokens;
  const std::vector<std::string> broken = e.check_invariants();
  if (!broken.empty()) die("prefix ttft: invariants: %s", broken.front().c_str());
  return r;
}

void report(const engine::ModelConfig& config) {
  std::printf(
      "\n== prefix cache (issue 15): %d waves of %d requests, %d system prompts of %d "
      "tokens + %d own tokens, max_tokens 4 ==\n",
      kWaves, kWaveSize, kSystemPrompts, kSystemTokens, kUserTokens);
  const Result off = run(config, false);
  const Result on = run(config, true);
  for (const auto& [name, r] : {std::pair<const char*, const Result&>{"cache off", off},
                                std::pair<const char*, const Result&>{"cache on", on}}) {
    std::printf(
        "  %-9s TTFT p50 %.1f ms, p90 %.1f ms (waves 2-%d: p50 %.1f, p90 %.1f); prompt "
        "rows computed %llu; hits %llu (%llu tokens); wall %.0f ms\n",
        name, percentile(r.ttft_ms, 0.5), percentile(r.ttft_ms, 0.9), kWaves,
        percentile(r.later_ttft_ms, 0.5), percentile(r.later_ttft_ms, 0.9),
        static_cast<unsigned long long>(r.prompt_rows), static_cast<unsigned long long>(r.hits),
        static_cast<unsigned long long>(r.hit_tokens), r.wall_ms);
  }
  std::printf("  TTFT p50 off/on %.2fx (waves 2-%d: %.2fx); prompt rows off/on %.2fx\n",
              percentile(off.ttft_ms, 0.5) / percentile(on.ttft_ms, 0.5), kWaves,
              percentile(off.later_ttft_ms, 0.5) / percentile(on.later_ttft_ms, 0.5),
              double(off.prompt_rows) / double(on.prompt_rows));
}

}  // namespace prefix_ttft

// ==== Issue 16: the cost of the batch-invariant mode (section 5; alone: --batch-invariant) ===
// One device and engine per mode, made in turn (off, then on), the same work on each: prefill
// of 8 x 2048-token prompts in 8192-row steps after one warm-up step, then decode at batch 64
// over ~1024-token contexts with the decode graphs (time_decode: 20 timed steps after 5).
namespace batch_invariance {

struct Result {
  double prefill_ms_per_step = 0;
  double prefill_tokens_per_s = 0;
  double decode_ms_per_step = 0;
};

constexpr int kPrompts = 8;
constexpr int kBatch = 64;
constexpr int kTokens = 64;  // per decode request: enough for the setup and 25 steps

Result run(const engine::ModelConfig& config, bool invariant, kernels::PrefillVariant variant_256) {
  kernels::CudaDeviceOptions o;
  o.random_seed = 12;
  o.time_steps = true;
  o.batch_invariant = invariant;
  o.batch_invariant_variant_256 = variant_256;
  auto made = kernels::CudaDevice::create(config, nullptr, o);
  if (!made) die("batch invariance: cuda device: %s", made.error().message.c_str());
  kernels::CudaDevice& device = *made.value();
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  ec.max_running = kBatch;
  ec.max_step_tokens = kMaxStepTokens;
  ec.batch_invariant = invariant;
  ec.pages_global = ec.pages_local =
      kBatch * ((kDecodePrompt + kTokens + kPageSize - 1) / kPageSize + 1) +
      kMaxStepTokens / kPageSize * 2;
  kernels::DecodeGraphConfig g;
  g.max_step_rows = ec.max_step_tokens;
  g.max_logits = ec.max_running;
  g.max_context = kPrefillPrompt + kTokens + kPageSize;
  g.page_size = ec.page_size;
  if (auto s = device.enable_decode_graphs(g); !s.ok())
    die("decode graphs: %s", s.error().message.c_str());
  auto created = engine::Engine::create(config, ec, device);
  if (!created) die("batch invariance: engine: %s", created.error().message.c_str());
  engine::Engine& e = *created.value();
  const CostModel cost(config, device.model(), measure_copy_bandwidth(device.stream()));
  g_device = &device;
  std::mt19937_64 rng(7);
  Result r;
  for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
  drain(e);  // warm-up
  for (int i = 0; i < kPrompts; ++i) submit(e, rng, kPrefillPrompt, 1);
  std::vector<double> ms;
  int64_t rows = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (!e.idle()) {
    Timed t = step(e);
    if (t.out.rows == 0) continue;
    ms.push_back(t.ms);
    rows += t.out.rows;
  }
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.prefill_ms_per_step = median(ms);
  r.prefill_tokens_per_s = rows / (wall * 1e-3);
  std::vector<engine::RequestControl> controls;
  for (int i = 0; i < kBatch; ++i) controls.push_back(submit(e, rng, kDecodePrompt, kTokens));
  for (int i = 0;; ++i) {
    if (i > 100) die("batch invariance: decode setup did not reach a pure decode step");
    Timed t = step(e);
    if (t.out.rows == kBatch &&
        std::all_of(t.out.updates.begin(), t.out.updates.end(),
                    [](const engine::RequestUpdate& u) { return u.scheduled_tokens == 1; })) {
      break;
    }
  }
  std::vector<Row> table;
  r.decode_ms_per_step = time_decode(
      e, cost, kBatch, invariant ? "decode b=64, invariant" : "decode b=64, default", table);
  // Where the decode step's GPU time goes (one eager step, observed).
  PhaseTimer timer(2048);
  kernels::set_forward_phase_observer(&timer);
  const Timed observed = step(e);
  kernels::set_forward_phase_observer(nullptr);
  double forward_ms = 0;
  const std::vector<double> phases = timer.phase_ms(&forward_ms);
  print_breakdown(invariant ? "decode b=64, invariant" : "decode b=64, default", phases, forward_ms,
                  observed.ms, r.decode_ms_per_step);
  for (auto& c : controls) c.abort();
  drain(e);
  if (device.decode_graph_stats().replays == 0) die("batch invariance: no graph replayed");
  g_device = nullptr;
  return r;
}

int report(const engine::ModelConfig& config) {
  std::printf("\n== batch-invariant mode (issue 16): %d x %d-token prefill, decode b=%d ==\n",
              kPrompts, kPrefillPrompt, kBatch);
  const Result off = run(config, false, kernels::PrefillVariant::kDefault);
  // The mode with its head_dim 256 variant, one warpgroup (CudaDeviceOptions' default; the
  // pair kernel, measured in session 4, has no fixed key chunks and is refused in the mode).
  const Result one = run(config, true, kernels::PrefillVariant::kWgmma);
  for (const auto& [name, on] : {std::pair<const char*, const Result&>{"one warpgroup", one}}) {
    std::printf(
        "  invariant (%s at head_dim 256): prefill %.1f ms/step (%.0f tokens/s, %.3f of the "
        "default's %.1f ms/step, %.0f tokens/s); decode b=64 (graphs) %.3f ms/step vs %.3f: "
        "%+.1f%% step time (target: within 15%%)\n",
        name, on.prefill_ms_per_step, on.prefill_tokens_per_s,
        on.prefill_tokens_per_s / off.prefill_tokens_per_s, off.prefill_ms_per_step,
        off.prefill_tokens_per_s, on.decode_ms_per_step, off.decode_ms_per_step,
        100.0 * (on.decode_ms_per_step / off.decode_ms_per_step - 1.0));
  }
  return 0;
}

}  // namespace batch_invariance

// ==== cuDNN's paged SDPA for the local layers (section 6; alone: --cudnn-prefill) =========
// CudaDeviceOptions::cudnn_local_prefill off, then on, one device and engine each (made in
// turn, after the rest), the prefill of section 1 on each: 16 x 2048-token prompts in
// 8192-row steps after one warm-up step (whose time, with the option on, holds the first plan
// builds), then one more 8192-row step observed by phase. TWINSTEP_CUDNN_PREFILL overrides
// both devices' option: each line says what its device resolved.
namespace cudnn_prefill {

struct Result {
  bool cudnn = false;  // as the device resolved it
  double warmup_ms = 0;
  double ms_per_step = 0;
  double median_ms = 0;
  double tokens_per_s = 0;
  double attention_ms = 0;  // of the observed step
  double forward_ms = 0;
  kernels::CudnnPrefillReport report;
};

Result run(const engine::ModelConfig& config, bool cudnn) {
  kernels::CudaDeviceOptions o;
  o.random_seed = 12;
  o.time_steps = true;
  o.cudnn_local_prefill = cudnn;
  auto made = kernels::CudaDevice::create(config, nullptr, o);
  if (!made) die("cudnn prefill: cuda device: %s", made.error().message.c_str());
  kernels::CudaDevice& device = *made.value();
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  ec.max_running = kPrefillRequests;
  ec.max_step_tokens = kMaxStepTokens;
  ec.pages_global = ec.pages_local =
      (kPrefillRequests + kMaxStepTokens / kPrefillPrompt) * (kPrefillPrompt / kPageSize + 2);
  kernels::DecodeGraphConfig g;  // as section 1: the GEMMs tuned, the buffers reserved once
  g.max_step_rows = ec.max_step_tokens;
  g.max_logits = ec.max_running;
  g.max_context = kPrefillPrompt + kPageSize;
  g.page_size = ec.page_size;
  if (auto s = device.enable_decode_graphs(g); !s.ok())
    die("cudnn prefill: decode graphs: %s", s.error().message.c_str());
  auto created = engine::Engine::create(config, ec, device);
  if (!created) die("cudnn prefill: engine: %s", created.error().message.c_str());
  engine::Engine& e = *created.value();
  g_device = &device;
  std::mt19937_64 rng(7);
  Result r;
  r.cudnn = device.cudnn_prefill_report().enabled;
  for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
  r.warmup_ms = step(e).ms;
  drain(e);
  for (int i = 0; i < kPrefillRequests; ++i) submit(e, rng, kPrefillPrompt, 1);
  std::vector<double> ms;
  int64_t rows = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (!e.idle()) {
    Timed t = step(e);
    if (t.out.rows == 0) continue;
    ms.push_back(t.ms);
    rows += t.out.rows;
  }
  const double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (rows != int64_t{kPrefillRequests} * kPrefillPrompt) {
    die("cudnn prefill: %lld rows, expected %d", static_cast<long long>(rows),
        kPrefillRequests * kPrefillPrompt);
  }
  r.ms_per_step = wall / static_cast<double>(ms.size());
  r.median_ms = median(ms);
  r.tokens_per_s = rows / (wall * 1e-3);
  for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
  PhaseTimer timer(2048);
  kernels::set_forward_phase_observer(&timer);
  const Timed observed = step(e);
  kernels::set_forward_phase_observer(nullptr);
  const std::vector<double> phases = timer.phase_ms(&r.forward_ms);
  r.attention_ms = phases[static_cast<int>(kernels::ForwardPhase::kAttention)];
  print_breakdown(r.cudnn ? "prefill step, 8192 rows, cuDNN local attention"
                          : "prefill step, 8192 rows, default attention",
                  phases, r.forward_ms, observed.ms, r.median_ms);
  drain(e);
  r.report = device.cudnn_prefill_report();
  if (r.cudnn && (r.report.fallbacks != 0 || r.report.steps == 0)) {
    die("cudnn prefill: %llu steps on cuDNN, %llu fell back (%s)",
        static_cast<unsigned long long>(r.report.steps),
        static_cast<unsigned long long>(r.report.fallbacks), r.report.last_fallback.c_str());
  }
  g_device = nullptr;
  return r;
}

// What the plan key costs at run time (issue 12, the serving key space): the same batches of one
// 12B local layer (8 KV heads, head_dim 256, page 16, shuffled pages, the fused-QKV Q stride)
// under plans whose keys declare the batch's own buckets (exact) or the limits (rows 8192, keys
// 131072 = the 12B's max_position_embeddings), entries padded to a power of 2, and a K/V
// container of 27000 pages (what the device declares for an H200-sized local pool). CUDA
// events, median of 20 runs after 3.
void keys_cost(const engine::ModelConfig& config) {
  const engine::FamilyGeometry& g = config.family(engine::Family::kLocal);
  const int32_t Hq = config.num_q_heads, page = kPageSize, seq_pages = 2048 / kPageSize;
  const int32_t seqs = 4, pages = seqs * seq_pages + 8;
  const int64_t q_stride = int64_t{Hq} * g.head_dim + 2 * int64_t{g.kv_heads} * g.head_dim;
  const int64_t o_stride = int64_t{Hq} * g.head_dim;
  const int64_t rows_cap = 2 * int64_t{kMaxStepTokens};  // the rows and the largest slack
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate(keys)");
  kernels::bf16 *pool = nullptr, *q = nullptr, *out = nullptr;
  const int64_t pool_elems = int64_t{pages} * 2 * page * g.kv_heads * g.head_dim;
  check_cuda(cudaMalloc(&pool, pool_elems * 2), "cudaMalloc(keys pool)");
  check_cuda(cudaMalloc(&q, rows_cap * q_stride * 2), "cudaMalloc(keys q)");
  check_cuda(cudaMalloc(&out, rows_cap * o_stride * 2), "cudaMalloc(keys out)");
  engine::WeightInitSpec spec;
  spec.seed = 77;
  spec.stddev = 0.1f;
  if (!kernels::fill_random_weights(pool, pool_elems, spec, stream).ok() ||
      !kernels::fill_random_weights(q, rows_cap * q_stride, spec, stream).ok()) {
    die("keys: random fill");
  }
  // Each seq lists seq_pages shuffled pages of 1..pages-1.
  std::vector<uint32_t> ids(pages - 1);
  for (int32_t i = 0; i < pages - 1; ++i) ids[i] = static_cast<uint32_t>(i + 1);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(3));
  ids.resize(int64_t{seqs} * seq_pages);
  std::vector<int32_t> begin(seqs + 1), first(seqs, 0);
  for (int32_t s = 0; s <= seqs; ++s) begin[s] = s * seq_pages;
  uint32_t* d_ids = nullptr;
  int32_t *d_begin = nullptr, *d_first = nullptr;
  check_cuda(cudaMalloc(&d_ids, ids.size() * 4), "cudaMalloc(keys ids)");
  check_cuda(cudaMalloc(&d_begin, begin.size() * 4), "cudaMalloc(keys begin)");
  check_cuda(cudaMalloc(&d_first, first.size() * 4), "cudaMalloc(keys first)");
  check_cuda(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "ids");
  check_cuda(cudaMemcpy(d_begin, begin.data(), begin.size() * 4, cudaMemcpyHostToDevice), "b");
  check_cuda(cudaMemcpy(d_first, first.data(), first.size() * 4, cudaMemcpyHostToDevice), "f");
  const kernels::PagingView paging{
      d_ids, d_begin, d_first, nullptr, static_cast<int32_t>(ids.size()), seqs};
  const kernels::KvPoolView pv{pool, 1, pages, page, g.kv_heads, g.head_dim};
  struct Case {
    const char* name;
    std::vector<kernels::CudnnPrefillSeq> entries;
  };
  const Case cases[] = {
      {"4 x 2048",
       {{0, 0, 2048, 2048}, {1, 2048, 2048, 2048}, {2, 4096, 2048, 2048}, {3, 6144, 2048, 2048}}},
      {"3 x 2048", {{0, 0, 2048, 2048}, {1, 2048, 2048, 2048}, {2, 4096, 2048, 2048}}},
      {"2 chunks of 1024", {{0, 0, 1024, 2048}, {1, 1024, 1024, 1024}}},
      {"1 x 512", {{0, 0, 512, 512}}},
  };
  struct Policy {
    const char* name;
    kernels::CudnnPrefillKeys keys;
    int32_t declared_pages;
  };
  const Policy policies[] = {
      {"exact", {false, false, false}, 0},
      {"rows 8192", {false, true, false}, 0},
      {"keys 131072", {false, false, true}, 0},
      {"serving", kernels::kCudnnServingKeys, 0},
      {"serving, 27000 pages", kernels::kCudnnServingKeys, 27000},
  };
  cudaEvent_t ev[2];
  for (cudaEvent_t& e : ev) check_cuda(cudaEventCreate(&e), "cudaEventCreate(keys)");
  std::printf("  cuDNN plan keys, one local layer (median of 20, ms):\n");
  for (const Case& c : cases) {
    kernels::CudnnPrefillBatch batch;
    batch.entries = c.entries;
    for (const auto& e : c.entries) {
      batch.rows = std::max(batch.rows, e.row_begin + e.q_len);
      batch.max_q_len = std::max(batch.max_q_len, e.q_len);
      batch.max_kv_len = std::max(batch.max_kv_len, e.kv_len);
    }
    std::string line = std::string("    ") + c.name + ":";
    for (const Policy& p : policies) {
      kernels::CudnnPrefillLimits l{16, 131072, 64};
      l.max_rows = kMaxStepTokens;
      l.declared_pages = p.declared_pages;
      l.pad_kv_len = 1;
      l.keys = p.keys;
      auto made = kernels::CudnnPrefill::create(pv, Hq, config.sliding_window, l);
      if (!made) die("keys: %s", made.error().message.c_str());
      kernels::CudnnPrefill& att = **made;
      std::vector<float> ms;
      for (int i = 0; i < 23; ++i) {
        if (auto st = att.prepare(batch, paging, q_stride, stream); !st.ok()) {
          die("keys %s %s: %s", c.name, p.name, st.error().message.c_str());
        }
        check_cuda(cudaEventRecord(ev[0], stream), "record");
        if (auto st = att.run(q, out, pv, 0, 1.0f, stream); !st.ok()) {
          die("keys %s %s: %s", c.name, p.name, st.error().message.c_str());
        }
        check_cuda(cudaEventRecord(ev[1], stream), "record");
        check_cuda(cudaEventSynchronize(ev[1]), "sync");
        float t = 0;
        check_cuda(cudaEventElapsedTime(&t, ev[0], ev[1]), "elapsed");
        if (i >= 3) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      char part[160];
      std::snprintf(part, sizeof part, " | %s %.4f (plan %.0f ms)", p.name, ms[ms.size() / 2],
                    att.stats().plan_build_ms_max);
      line += part;
    }
    std::printf("%s\n", line.c_str());
  }
  for (cudaEvent_t e : ev) cudaEventDestroy(e);
  for (void* ptr :
       {static_cast<void*>(pool), static_cast<void*>(q), static_cast<void*>(out),
        static_cast<void*>(d_ids), static_cast<void*>(d_begin), static_cast<void*>(d_first)}) {
    cudaFree(ptr);
  }
  cudaStreamDestroy(stream);
}

int report(const engine::ModelConfig& config) {
  std::printf(
      "\n== cuDNN local prefill attention (CudaDeviceOptions::cudnn_local_prefill): %d x "
      "%d-token prompts, max_step_tokens %d ==\n",
      kPrefillRequests, kPrefillPrompt, kMaxStepTokens);
  if (std::getenv("TWINSTEP_BENCH_CUDNN_KEYS") != nullptr) keys_cost(config);
  const Result off = run(config, false);
  const Result on = run(config, true);
  for (const Result* r : {&off, &on}) {
    const kernels::CudnnPrefillReport& c = r->report;
    std::printf(
        "  prefill %-17s %.1f ms/step (median %.1f), %.0f prompt tokens/s; attention %.2f ms "
        "of forward %.1f ms (observed step); warm-up step %.1f ms\n",
        r->cudnn ? "cuDNN local:" : "default kernel:", r->ms_per_step, r->median_ms,
        r->tokens_per_s, r->attention_ms, r->forward_ms, r->warmup_ms);
    if (r->cudnn) {
      std::printf(
          "    cuDNN: %llu steps, %llu fallbacks; plans built %d of %d keys (total %.1f ms, max "
          "%.1f ms; prebuilt in %.1f ms %s the pools), engine %lld, workspace %lld B, Stats %.2f "
          "MiB, scratch %.2f MiB, device memory %.2f MiB\n",
          static_cast<unsigned long long>(c.steps), static_cast<unsigned long long>(c.fallbacks),
          c.plans.plans_built, c.plans.keys, c.plans.plan_build_ms_total, c.plans.plan_build_ms_max,
          c.plans.prebuild_ms, c.built_before_pools ? "before" : "after",
          static_cast<long long>(c.plans.engine_global_index),
          static_cast<long long>(c.plans.workspace_bytes), c.plans.stats_bytes / 1048576.0,
          c.plans.scratch_bytes / 1048576.0, c.plans.device_bytes / 1048576.0);
    } else if (!c.unavailable.empty()) {
      std::printf("    cuDNN unavailable: %s\n", c.unavailable.c_str());
    }
  }
  std::printf("  cuDNN/default: step %.3f, tokens/s %.3f, attention %.3f\n",
              on.ms_per_step / off.ms_per_step, on.tokens_per_s / off.tokens_per_s,
              on.attention_ms / off.attention_ms);
  return 0;
}

}  // namespace cudnn_prefill

// ==== Issue 13: L2 prefetch of the next GEMM's weights (--decode-prefetch, --prefetch-probe) ==
// The decode section with each batch run under several kernels::L2PrefetchConfig arms in one
// process (graphs re-captured per arm), and a probe of single GEMMs with a cold L2 against the
// same GEMM after its leading weights were prefetched.
namespace l2_prefetch_ab {

struct Arm {
  const char* name;
  kernels::L2PrefetchConfig config;
};
// Every batch runs these in this order; "off" and "after 32MB" twice, to see the drift.
std::vector<Arm> arms() {
  constexpr int64_t kMiB = 1 << 20;
  constexpr int32_t kAll = 1 << 20;  // every batch of the A/B prefetches
  return {{"off", {}},
          {"after 16MB", {16 * kMiB, kAll, false}},
          {"after 32MB", {32 * kMiB, kAll, false}},
          {"after 48MB", {48 * kMiB, kAll, false}},
          {"beside 32MB", {32 * kMiB, kAll, true}},
          {"off", {}},
          {"after 32MB", {32 * kMiB, kAll, false}}};
}
constexpr int kStepsPerArm = kDecodeWarmup + kDecodeTimed;

void set(kernels::CudaDevice& device, const kernels::L2PrefetchConfig& config) {
  if (auto s = device.set_l2_prefetch(config); !s.ok())
    die("l2 prefetch: %s", s.error().message.c_str());
}

// One batch: every arm with the graphs, then (b <= 16) one observed eager step off and on.
void decode_batch(engine::Engine& e, kernels::CudaDevice& device, const CostModel& cost, int batch,
                  std::vector<Row>& table, PhaseTimer& timer) {
  std::string line;
  for (const Arm& a : arms()) {
    set(device, a.config);
    const double med =
        time_decode(e, cost, batch, "b=" + std::to_string(batch) + " " + a.name, table);
    char part[96];
    std::snprintf(part, sizeof part, "  %s %.3f", a.name, med);
    line += part;
  }
  std::printf("\nl2 prefetch A/B b=%d (graphs, median ms/step):%s\n", batch, line.c_str());
  if (batch <= 16) {
    for (const Arm& a : {arms()[0], arms()[2]}) {
      set(device, a.config);
      timer.reset();
      kernels::set_forward_phase_observer(&timer);
      Timed t = step(e);
      kernels::set_forward_phase_observer(nullptr);
      double forward_ms = 0;
      const std::vector<double> phases = timer.phase_ms(&forward_ms);
      const std::string title = "eager decode step, batch " + std::to_string(batch) + ", " + a.name;
      print_breakdown(title.c_str(), phases, forward_ms, t.ms, t.ms);
    }
  }
  set(device, {});
}

// Layer 0's four GEMMs at m = 1 and 16: L2 flushed (a 512 MiB memset), then the first X MiB of
// the weights prefetched (X = 0: none), the stream synchronised and 200 us slept (the lines
// land), then the GEMM alone between two events. profile: one repetition each inside
// cudaProfilerStart/Stop, for ncu --profile-from-start off --cache-control none.
void probe(kernels::CudaDevice& device, bool profile) {
  const engine::ModelConfig& c = device.model().config();
  const kernels::DeviceModel::Layer& L = device.model().layer(0);
  const cudaStream_t st = device.stream();
  struct Shape {
    const char* name;
    const kernels::bf16* w;
    int32_t n, k;
  };
  const int32_t H = c.hidden_size, I = c.intermediate_size;
  const Shape shapes[] = {{"qkv", L.qkv, L.qkv_cols, H},
                          {"o_proj", L.o, H, c.num_q_heads * L.head_dim},
                          {"gate_up", L.gate_up, 2 * I, H},
                          {"down", L.down, H, I}};
  constexpr int kRowsMax = 16;
  constexpr size_t kFlushBytes = size_t{512} << 20;
  void *x = nullptr, *y = nullptr, *flush = nullptr;
  check_cuda(cudaMalloc(&x, size_t{kRowsMax} * I * 2), "cudaMalloc(probe x)");
  check_cuda(cudaMalloc(&y, size_t{kRowsMax} * 2 * I * 2), "cudaMalloc(probe y)");
  check_cuda(cudaMalloc(&flush, kFlushBytes), "cudaMalloc(probe flush)");
  check_cuda(cudaMemsetAsync(x, 0x3c, size_t{kRowsMax} * I * 2, st), "cudaMemset(probe x)");
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  std::printf("\n== L2 prefetch probe: layer 0 GEMMs, cold L2 vs the first X MiB prefetched ==\n");
  if (profile) check_cuda(cudaProfilerStart(), "cudaProfilerStart");
  for (const Shape& sh : shapes) {
    const int64_t w_bytes = int64_t{sh.n} * sh.k * 2;
    for (const int m : {1, kRowsMax}) {
      std::string line;
      double cold = 0;
      for (const int mb : {0, 8, 16, 32, 48}) {
        const int64_t bytes = std::min<int64_t>(int64_t{mb} << 20, w_bytes);
        std::vector<double> us;
        for (int r = 0; r < (profile ? 1 : 9); ++r) {
          check_cuda(cudaMemsetAsync(flush, r & 0xff, kFlushBytes, st), "cudaMemset(flush)");
          if (bytes > 0) {
            if (auto s = kernels::l2_prefetch(sh.w, bytes, st); !s.ok())
              die("%s", s.error().message.c_str());
          }
          check_cuda(cudaStreamSynchronize(st), "sync(probe)");
          std::this_thread::sleep_for(std::chrono::microseconds(200));
          check_cuda(cudaEventRecord(e0, st), "cudaEventRecord");
          if (auto s = device.blas().gemm(static_cast<const kernels::bf16*>(x), sh.w,
                                          static_cast<kernels::bf16*>(y), m, sh.n, sh.k);
              !s.ok()) {
            die("probe gemm: %s", s.error().message.c_str());
          }
          check_cuda(cudaEventRecord(e1, st), "cudaEventRecord");
          check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
          float ms = 0;
          check_cuda(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
          us.push_back(ms * 1e3);
        }
        const double med = median(us);
        if (mb == 0) cold = med;
        char part[96];
        if (mb == 0) {
          std::snprintf(part, sizeof part, "  cold %.1f us", med);
        } else {
          std::snprintf(part, sizeof part, "  %d MiB %.1f (%+.1f)", mb, med, med - cold);
        }
        line += part;
      }
      std::printf("probe %-7s m=%-2d (%.1f MB):%s\n", sh.name, m, w_bytes / 1e6, line.c_str());
    }
  }
  if (profile) check_cuda(cudaProfilerStop(), "cudaProfilerStop");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(x);
  cudaFree(y);
  cudaFree(flush);
}

}  // namespace l2_prefetch_ab

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a pipe (tee) even if we die
  auto preset = engine::ModelConfig::preset("gemma4-12b");
  if (!preset) die("preset gemma4-12b: %s", preset.error().message.c_str());
  const engine::ModelConfig& config = preset.value();

  int ordinal = 0;
  check_cuda(cudaGetDevice(&ordinal), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / double(1 << 30));

  kernels::CudaDeviceOptions dopt;
  dopt.device_ordinal = ordinal;
  dopt.random_seed = 12;
  dopt.time_steps = true;
  // --decode-batch-invariant: the decode sections (2 and 3) with the batch-invariant mode on
  // (issue 16: every row on the pinned prefill kernel and the GEMM pins, long contexts included).
  const bool invariant_decode = argc == 2 && std::string(argv[1]) == "--decode-batch-invariant";
  dopt.batch_invariant = invariant_decode;
  // --decode-prefetch re-captures the graphs with the L2 prefetch's side stream, which cannot
  // cross a graph piece's cut: one piece a bucket there.
  if (argc == 2 && std::string(argv[1]) == "--decode-prefetch") dopt.decode_graph_pieces = 1;
  const auto tw = std::chrono::steady_clock::now();
  auto made = kernels::CudaDevice::create(config, nullptr, dopt);
  if (!made) die("cuda device: %s", made.error().message.c_str());
  kernels::CudaDevice& device = *made.value();
  g_device = &device;
  std::printf("gemma4-12b random weights: %.2f GB in %.2f s\n", device.model().arena_bytes() / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - tw).count());
  // Indexed by GatedPairEpilogue (kStagedQuad: staged, in clusters of four).
  constexpr const char* kEpilogueNames[] = {"registers", "staged", "tensor-store",
                                            "staged (clusters of four)"};
  static_assert(std::size(kEpilogueNames) ==
                static_cast<size_t>(kernels::GatedPairEpilogue::kStagedQuad) + 1);
  std::printf(
      "gated gate|up GEMM (kernels/gemm_gated.h) for steps of >= %d rows (0: off), in clusters "
      "from %d rows (0: never) with the %s epilogue\n",
      device.options().gated_gemm_min_rows, device.options().gated_gemm_pair_min_rows,
      kEpilogueNames[static_cast<int>(device.options().gated_gemm_pair_epilogue)]);
  if (argc == 3 && std::string(argv[1]) == "--records") {
    return cost_records::write_step_records(config, device, prop, argv[2]);
  }
  if (argc == 2 && std::string(argv[1]) == "--batch-invariant") {
    g_device = nullptr;
    made.value().reset();
    return batch_invariance::report(config);
  }
  if (argc == 2 && std::string(argv[1]) == "--cudnn-prefill") {
    g_device = nullptr;
    made.value().reset();
    return cudnn_prefill::report(config);
  }
  if (argc == 2 && std::string(argv[1]) == "--prefetch-probe") {  // under ncu (untuned GEMMs)
    l2_prefetch_ab::probe(device, true);
    return 0;
  }
  // --decode-prefetch: section 2 with the L2 prefetch A/B per batch, after the probe.
  const bool prefetch_ab = argc == 2 && std::string(argv[1]) == "--decode-prefetch";
  // --decode: sections 2 and 3 only (the decode tables with the host path; issue 13 item 3).
  const bool decode_only =
      invariant_decode || prefetch_ab || (argc == 2 && std::string(argv[1]) == "--decode");
  // --prefill: section 1 only (the prefill table and its phases; an A/B of one process an arm).
  const bool prefill_only = argc == 2 && std::string(argv[1]) == "--prefill";
  if (argc != 1 && !decode_only && !prefill_only) {
    die("usage: engine_throughput_bench [--records FILE | --batch-invariant | --decode | "
        "--prefill | --decode-batch-invariant | --decode-prefetch | --prefetch-probe | "
        "--cudnn-prefill]");
  }

  const double bandwidth = measure_copy_bandwidth(device.stream());
  std::printf(
      "copy bandwidth (D2D 512 MiB, read+write): %.0f GB/s; compute floor at %.0f TFLOP/s\n",
      bandwidth / 1e9, kPeakFlops / 1e12);
  const CostModel cost(config, device.model(), bandwidth);
  std::printf(
      "linear params %.3fe9 (+ LM head %.3fe9 per logits row); weights read per step %.2f GB\n",
      cost.linear_params() / 1e9, double(config.vocab_size) * config.hidden_size / 1e9,
      cost.weight_bytes() / 1e9);

  // Pools hold every decode request's whole context in both families (no preemption). Each
  // batch size runs 25 steps with the decode graphs and 25 without.
  // The prefetch A/B runs every arm at every batch: 4 x 7 arms of 25 steps, plus 4 observed.
  const int max_tokens =
      prefetch_ab
          ? 4 * static_cast<int>(l2_prefetch_ab::arms().size()) * l2_prefetch_ab::kStepsPerArm + 96
          : 320;
  const int pages_per_request = (kDecodePrompt + max_tokens + kPageSize - 1) / kPageSize + 1;
  engine::EngineConfig ec;
  ec.page_size = kPageSize;
  // The long-context case (section 3) holds kLongBatch whole kLongPrompt contexts globally;
  // its local pages are only the window's.
  const int long_pages = (kLongPrompt + kLongTokens + kPageSize - 1) / kPageSize + 1;
  const int max_batch = decode_max_batch();
  ec.pages_global = std::max(max_batch * pages_per_request, kLongBatch * long_pages);
  ec.pages_local = max_batch * pages_per_request;
  ec.max_running = max_batch;
  ec.max_step_tokens = kMaxStepTokens;
  ec.batch_invariant = invariant_decode;
  // Decode CUDA graphs (issue 13 item 2), captured before the pools exist.
  {
    kernels::DecodeGraphConfig g;
    g.max_step_rows = ec.max_step_tokens;
    g.max_logits = ec.max_running;
    g.max_context = kLongPrompt + kLongTokens + kPageSize;
    g.page_size = ec.page_size;
    const auto t0 = std::chrono::steady_clock::now();
    auto enabled = device.enable_decode_graphs(g);
    if (!enabled.ok()) die("decode graphs: %s", enabled.error().message.c_str());
    const kernels::DecodeGraphStats gs = device.decode_graph_stats();
    std::printf(
        "decode graphs: %d buckets up to %d rows, %d piece(s) a bucket, captured in %.2f s, "
        "%.1f MiB of device memory (measured before the pools were sized); GEMM tuning %.2f s "
        "(decode buckets timed in graphs: %s)\n",
        gs.buckets, gs.largest_bucket, gs.pieces,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
        gs.graph_bytes / 1048576.0, device.gemm_tune_ms() / 1e3,
        device.options().gemm_tune_in_graphs ? "yes" : "no");
  }
  if (prefetch_ab) l2_prefetch_ab::probe(device, false);  // tuned GEMMs, before the pools
  auto created = engine::Engine::create(config, ec, device);
  if (!created) die("engine: %s", created.error().message.c_str());
  engine::Engine& e = *created.value();
  std::printf("decode graphs re-captured over the pools: %.2f MiB more, %llu re-instantiated\n",
              device.decode_graph_stats().rebind_bytes / 1048576.0,
              static_cast<unsigned long long>(device.decode_graph_stats().reinstantiated));
  size_t free_b = 0, total_b = 0;
  check_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  std::printf("pools: %d pages/family of %d tokens; GPU memory free after bind %.1f GiB\n",
              ec.pages_global, kPageSize, free_b / double(1 << 30));

  std::mt19937_64 rng(7);
  std::vector<Row> table;
  PhaseTimer timer(2048);

  // ---- 1. prefill -------------------------------------------------------------------------
  if (!decode_only) {
    // Warm-up: one full step (activation buffers grow, cuBLAS picks its kernels).
    for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
    drain(e);
    // TWINSTEP_BENCH_PREFILL_REQUESTS=N (a multiple of 4, default 16) and
    // TWINSTEP_BENCH_PREFILL_OBSERVE=1 (every timed step under the phase observer, its phases
    // and its wall-clock start printed, to match with an nvidia-smi log of clocks and power):
    // the diagnosis of session 15's slow third step.
    const int prefill_requests = prefill_request_count();
    const bool observe_each = std::getenv("TWINSTEP_BENCH_PREFILL_OBSERVE") != nullptr;
    for (int i = 0; i < prefill_requests; ++i) submit(e, rng, kPrefillPrompt, 1);
    std::vector<double> ms, host, host_phases[10];
    std::vector<std::string> observed;
    Cost total_cost;
    int64_t rows = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (!e.idle()) {
      double start_epoch_ms = 0;
      if (observe_each) {
        start_epoch_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
        timer.reset();
        kernels::set_forward_phase_observer(&timer);
      }
      Timed t = step(e);
      if (observe_each) kernels::set_forward_phase_observer(nullptr);
      if (t.out.rows == 0) continue;
      if (observe_each) observed.push_back(observed_step_line(timer, start_epoch_ms, t.ms));
      ms.push_back(t.ms);
      if (g_device != nullptr) host.push_back(t.ms - g_device->last_step_gpu_ms());
      push_host_phases(e, t.ms, host_phases);
      rows += t.out.rows;
      total_cost += cost.step_cost(t.out);
    }
    const double wall =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rows != int64_t{prefill_requests} * kPrefillPrompt) {
      die("prefill computed %lld rows, expected %d", static_cast<long long>(rows),
          prefill_requests * kPrefillPrompt);
    }
    const int steps = static_cast<int>(ms.size());
    std::printf("\n== prefill: %d x %d-token prompts, max_tokens 1, max_step_tokens %d ==\n",
                prefill_requests, kPrefillPrompt, kMaxStepTokens);
    for (const std::string& line : observed) std::printf("%s\n", line.c_str());
    std::printf("  %d steps, %.1f ms total, %.1f ms/step (median %.1f), %.0f prompt tokens/s\n",
                steps, wall, wall / steps, median(ms), rows / (wall * 1e-3));
    std::string each;
    for (double m : ms) each += " " + std::to_string(m).substr(0, 7);
    std::printf("  each step, ms:%s\n", each.c_str());
    if (host.size() == ms.size()) {  // the GPU's part: plan upload to the sampled ids
      std::string gpu;
      for (size_t i = 0; i < ms.size(); ++i)
        gpu += " " + std::to_string(ms[i] - host[i]).substr(0, 7);
      std::printf("  each step, GPU ms (plan upload to sampled ids):%s\n", gpu.c_str());
    }
    std::printf("  floor: %.1f ms (memory %.1f, compute %.1f); measured/floor %.2f\n",
                cost.floor_ms(total_cost), cost.memory_ms(total_cost), cost.compute_ms(total_cost),
                wall / cost.floor_ms(total_cost));
    if (!host.empty()) {
      const auto& ph = host_phases;
      std::printf(
          "  host path (step wall - GPU time from plan upload to sampled ids): median %.3f ms; "
          "host phases, median us: admit %.1f, plan %.1f, device: check %.1f, stage %.1f, "
          "launch %.1f (of it the forward's set-up before its first kernel %.1f), wait %.1f, "
          "post %.1f; commit %.1f, outside the scheduler %.1f\n",
          median(host), median(ph[0]), median(ph[1]), median(ph[2]), median(ph[3]), median(ph[4]),
          median(ph[9]), median(ph[5]), median(ph[6]), median(ph[7]), median(ph[8]));
    }
    table.push_back({"prefill " + std::to_string(prefill_requests) + "x2048", double(rows) / steps,
                     wall / steps, rows / (wall * 1e-3), cost.memory_ms(total_cost) / steps,
                     cost.compute_ms(total_cost) / steps, cost.floor_ms(total_cost) / steps});

    // Breakdown: one more full 8192-row step, observed.
    for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
    timer.reset();
    kernels::set_forward_phase_observer(&timer);
    Timed t = step(e);
    kernels::set_forward_phase_observer(nullptr);
    double forward_ms = 0;
    const std::vector<double> phases = timer.phase_ms(&forward_ms);
    char title[128];
    std::snprintf(title, sizeof title, "prefill step, %d rows (%d x %d)", t.out.rows,
                  kMaxStepTokens / kPrefillPrompt, kPrefillPrompt);
    print_breakdown(title, phases, forward_ms, t.ms, median(ms));
    if (trace_enabled()) {
      for (int i = 0; i < kMaxStepTokens / kPrefillPrompt; ++i) submit(e, rng, kPrefillPrompt, 1);
      trace_step(e, "prefill step, 8192 rows");
    }
    drain(e);
  }

  // ---- 2. decode --------------------------------------------------------------------------
  if (!prefill_only) {
    std::vector<engine::RequestControl> controls;
    for (int i = 0; i < max_batch; ++i) {
      controls.push_back(submit(e, rng, kDecodePrompt, max_tokens));
    }
    // Prefill every context (mixed with the decode of the early ones) until a step is pure
    // decode of the whole batch.
    const auto t0 = std::chrono::steady_clock::now();
    int setup_steps = 0;
    for (;;) {
      Timed t = step(e);
      ++setup_steps;
      if (setup_steps > 200) die("decode setup did not reach a pure decode step");
      const bool pure_decode =
          t.out.rows == max_batch &&
          std::all_of(t.out.updates.begin(), t.out.updates.end(),
                      [](const engine::RequestUpdate& u) { return u.scheduled_tokens == 1; });
      if (pure_decode) break;
    }
    std::printf("\n== decode setup: %d x %d-token prompts prefilled in %d steps, %.2f s ==\n",
                max_batch, kDecodePrompt, setup_steps,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    int live = max_batch;
    for (const int batch : {128, 64, 16, 1}) {
      if (batch > max_batch) continue;
      for (int i = batch; i < live; ++i) controls[i].abort();
      live = batch;
      if (prefetch_ab) {
        l2_prefetch_ab::decode_batch(e, device, cost, batch, table, timer);
        continue;
      }
      const double med = time_decode(e, cost, batch, "decode b=" + std::to_string(batch), table);
      device.set_decode_graph_mode(kernels::DecodeGraphMode::kOff);
      const double eager = time_decode(e, cost, batch, "  eager b=" + std::to_string(batch), table);
      device.set_decode_graph_mode(kernels::DecodeGraphMode::kReplay);
      std::printf("  graphs: %.3f ms/step, eager %.3f: %.2fx\n", med, eager, eager / med);
      if (batch == 128 || batch == 64 || batch == 16 || batch == 1) {
        timer.reset();
        kernels::set_forward_phase_observer(&timer);
        Timed t = step(e);
        kernels::set_forward_phase_observer(nullptr);
        double forward_ms = 0;
        const std::vector<double> phases = timer.phase_ms(&forward_ms);
        const std::string title = "decode step, batch " + std::to_string(batch);
        print_breakdown(title.c_str(), phases, forward_ms, t.ms, med);
      }
      if (trace_enabled()) {
        trace_step(e, "decode b=" + std::to_string(batch) + ", graphs");
        device.set_decode_graph_mode(kernels::DecodeGraphMode::kOff);
        trace_step(e, "decode b=" + std::to_string(batch) + ", eager");
        device.set_decode_graph_mode(kernels::DecodeGraphMode::kReplay);
      }
    }
    for (auto& c : controls) c.abort();
    drain(e);
  }

  // TWINSTEP_BENCH_QUICK=1: sections 1 and 2 and the summary only (a short device call).
  const bool quick = std::getenv("TWINSTEP_BENCH_QUICK") != nullptr;
  // ---- 3. long-context decode: kLongBatch x kLongPrompt ---------------------------------
  if (!prefetch_ab && !quick && !prefill_only) {
    std::vector<engine::RequestControl> controls;
    for (int i = 0; i < kLongBatch; ++i)
      controls.push_back(submit(e, rng, kLongPrompt, kLongTokens));
    const auto t0 = std::chrono::steady_clock::now();
    int setup_steps = 0;
    for (;;) {
      Timed t = step(e);
      if (++setup_steps > 400) die("long-context setup did not reach a pure decode step");
      if (t.out.rows == kLongBatch &&
          std::all_of(t.out.updates.begin(), t.out.updates.end(),
                      [](const engine::RequestUpdate& u) { return u.scheduled_tokens == 1; })) {
        break;
      }
    }
    std::printf("\n== long-context setup: %d x %d-token prompts prefilled in %d steps, %.2f s ==\n",
                kLongBatch, kLongPrompt, setup_steps,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    time_decode(e, cost, kLongBatch, "decode b=16 32k", table);
    device.set_decode_graph_mode(kernels::DecodeGraphMode::kOff);
    time_decode(e, cost, kLongBatch, "  eager b=16 32k", table);
    device.set_decode_graph_mode(kernels::DecodeGraphMode::kReplay);
    for (auto& c : controls) c.abort();
    drain(e);
  }

  const std::vector<std::string> broken = e.check_invariants();
  if (!broken.empty()) die("engine invariants after the run: %s", broken.front().c_str());
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(end)");

  const kernels::DecodeGraphStats gs = device.decode_graph_stats();
  std::printf(
      "\ndecode graphs: %llu replays (%llu padding rows), %llu eager decode steps (%llu "
      "no bucket, %llu page capacity, %llu observed), %llu invalidations\n",
      static_cast<unsigned long long>(gs.replays), static_cast<unsigned long long>(gs.padded_rows),
      static_cast<unsigned long long>(gs.eager_decode_steps),
      static_cast<unsigned long long>(gs.misses_no_bucket),
      static_cast<unsigned long long>(gs.misses_page_capacity),
      static_cast<unsigned long long>(gs.misses_observer),
      static_cast<unsigned long long>(gs.invalidations));
  if (gs.invalidations != 0 || (gs.replays == 0 && !prefill_only)) {
    die("the decode graphs did not run the decode");
  }
  std::printf("\n== summary (gemma4-12b geometry, random bf16 weights, %s) ==\n", prop.name);
  std::printf("copy bandwidth %.0f GB/s, compute peak assumed %.0f TFLOP/s\n", bandwidth / 1e9,
              kPeakFlops / 1e12);
  std::printf("| %-16s | %9s | %10s | %11s | %12s | %12s | %8s |\n", "case", "rows/step", "ms/step",
              "tokens/s", "floor mem ms", "floor fl ms", "meas/flr");
  for (const Row& r : table) {
    std::printf("| %-16s | %9.0f | %10.3f | %11.0f | %12.3f | %12.3f | %8.2f |\n", r.name.c_str(),
                r.rows_per_step, r.ms_per_step, r.tokens_per_s, r.floor_mem_ms, r.floor_compute_ms,
                r.ms_per_step / r.floor_ms);
  }
  // The prefix-cache case makes its own devices and engines: this one goes first.
  created.value().reset();
  g_device = nullptr;
  made.value().reset();
  if (decode_only || quick || prefill_only) return 0;
  prefix_ttft::report(config);
  cudnn_prefill::report(config);
  return batch_invariance::report(config);
}
