// The step contract (DESIGN.md §2.1): submit / step / metrics. The Engine owns the page pools,
// the per-request KV state and the scheduler; a Device executes the plans it builds.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/fault.h"
#include "engine/ids.h"
#include "engine/mutants.h"
#include "engine/plan.h"
#include "engine/result.h"

namespace twinstep::engine {

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_ids;
};

enum class TerminalKind : uint8_t { kStop, kLength, kAborted, kRejected, kFailed };
const char* terminal_kind_name(TerminalKind kind);

enum class RejectReason : uint8_t {
  kNone,
  kEmptyPrompt,
  kZeroMaxTokens,
  kExceedsContext,  // prompt + max_tokens > the context limit
  kTokenOutOfVocab,
  kNeverFits,    // the request could not fit the pools even if it ran alone
  kBadSampling,  // temperature < 0, top_p outside (0, 1], top_k < 0
};
inline constexpr int kRejectReasonCount = 7;
const char* reject_reason_name(RejectReason reason);

struct Terminal {
  TerminalKind kind = TerminalKind::kStop;
  RejectReason reason = RejectReason::kNone;  // kRejected only
  std::string message;                        // kRejected / kFailed: what was wrong
};

// Where a request is in its life; used for coverage and abort accounting.
enum class RequestPhase : uint8_t { kQueued, kWaiting, kPrefill, kDecode, kPreempted, kDone };
inline constexpr int kRequestPhaseCount = 6;
const char* request_phase_name(RequestPhase phase);

// Handle returned by submit. abort() only sets a flag; the scheduler retires the request at
// its next touch. Safe from any thread, idempotent, valid after the request finished.
class RequestControl {
 public:
  RequestControl() = default;
  // `aborts`: the engine's count of aborts asked for, bumped once per request after its flag is
  // set, so the scheduler looks for flags only when it moved (Scheduler::retire_aborted).
  RequestControl(RequestId id, std::shared_ptr<std::atomic<bool>> flag,
                 std::shared_ptr<std::atomic<uint64_t>> aborts = nullptr)
      : id_(id), flag_(std::move(flag)), aborts_(std::move(aborts)) {}
  RequestId id() const { return id_; }
  void abort() const {
    if (flag_ && !flag_->exchange(true, std::memory_order_acq_rel) && aborts_ &&
        !TS_MUTANT(kAbortCountNotBumped)) {
      aborts_->fetch_add(1, std::memory_order_release);
    }
  }
  bool abort_requested() const { return flag_ && flag_->load(std::memory_order_acquire); }

 private:
  RequestId id_;
  std::shared_ptr<std::atomic<bool>> flag_;
  std::shared_ptr<std::atomic<uint64_t>> aborts_;
};

// The tokens an update brings. A step samples at most one token per request, so up to
// kInline live in the update itself: a decode step allocates nothing per request for them
// (issue 13 item 3). More spill to the heap. Read as a contiguous range of int32_t (begin/end
// are pointers, so a std::span<const int32_t> takes it).
class TokenList {
 public:
  using value_type = int32_t;
  using const_iterator = const int32_t*;
  using iterator = const int32_t*;
  static constexpr int32_t kInline = 4;

  TokenList() = default;
  TokenList(std::initializer_list<int32_t> tokens) {
    for (const int32_t t : tokens) push_back(t);
  }
  void push_back(int32_t token) {
    if (size_ < kInline) {
      inline_[size_++] = token;
      return;
    }
    if (size_ == kInline) heap_.assign(inline_, inline_ + kInline);
    heap_.push_back(token);
    size_ += 1;
  }
  void clear() {
    size_ = 0;
    heap_.clear();
  }
  size_t size() const { return static_cast<size_t>(size_); }
  bool empty() const { return size_ == 0; }
  const int32_t* data() const { return size_ <= kInline ? inline_ : heap_.data(); }
  const int32_t* begin() const { return data(); }
  const int32_t* end() const { return data() + size_; }
  const int32_t& operator[](size_t i) const { return data()[i]; }
  const int32_t& front() const { return data()[0]; }
  const int32_t& back() const { return data()[size_ - 1]; }
  friend bool operator==(const TokenList& a, const TokenList& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  int32_t size_ = 0;
  int32_t inline_[kInline] = {};
  std::vector<int32_t> heap_;  // all the tokens once there are more than kInline
};

// One flat update per touched request per step.
struct RequestUpdate {
  RequestId id;
  int32_t scheduled_tokens = 0;  // rows this request had in the step (0 if not scheduled)
  int32_t kv_len = 0;            // frontier after the step
  TokenList new_tokens;
  // [new_tokens.size()] when the request asked for logprobs (sampling.top_logprobs >= 0):
  // what the device reported for each new token. Else empty.
  std::vector<RowLogprobs> logprobs;
  bool preempted = false;  // its KV was dropped; it will be recomputed
  // Admitted this step with this many prompt tokens' K/V taken from the prefix cache (page
  // aligned): the frontier moved by cached_tokens + scheduled_tokens.
  int32_t cached_tokens = 0;
  std::optional<Terminal> terminal;
};

struct StepOutputs {
  uint64_t step_index = 0;
  bool device_ran = false;  // a plan with rows reached the device
  bool failed = false;      // the device failed; no request state moved
  std::string error;        // why, when failed
  int32_t rows = 0;
  int64_t cost_ns = 0;
  std::vector<RequestUpdate> updates;
};

struct FamilyLoad {
  int32_t pages_used = 0;   // held by requests
  int32_t pages_total = 0;  // excluding the padding page
  int32_t pages_peak = 0;
  int32_t pages_cached = 0;  // held by no request, kept for prefix hits (evictable)
  uint64_t evictions = 0;    // cached pages taken back for new KV
};

struct Counters {
  uint64_t submitted = 0;
  uint64_t terminals[5] = {};  // by TerminalKind
  uint64_t rejections[kRejectReasonCount] = {};
  uint64_t tokens_generated = 0;
  uint64_t prompt_tokens_computed = 0;  // prefill rows, recompute included
  uint64_t steps = 0;
  uint64_t steps_failed = 0;
  uint64_t preemptions = 0;
  uint64_t window_pages_released = 0;
  uint64_t chunked_prefills = 0;  // prefill steps that did not finish the prompt
  uint64_t admission_waits = 0;   // steps where the queue head waited on a full pool
  uint64_t aborts_by_phase[kRequestPhaseCount] = {};
  uint64_t prefix_hits = 0;              // admissions that took K/V from the prefix cache
  uint64_t prefix_hit_tokens = 0;        // prompt tokens those admissions did not compute
  uint64_t hits_rolled_back = 0;         // hits taken by admissions in steps that then failed
  uint64_t shared_page_aborts = 0;       // aborts of requests holding a page others hold too
  uint64_t shared_page_preemptions = 0;  // the same for preemptions

  // Field-wise sum, for totals over several engines (campaign seeds).
  Counters& operator+=(const Counters& other);
};

// The load feed. Pull-only; a consistent snapshot taken at the end of the last step.
struct Metrics {
  int32_t running = 0;
  int32_t waiting = 0;
  FamilyLoad global;
  FamilyLoad local;
  Counters counters;
  DeviceStats device;  // the device's own report (Device::stats) after the last step
  const FamilyLoad& family(Family f) const { return f == Family::kGlobal ? global : local; }
};

struct EngineConfig {
  int32_t page_size = 16;      // tokens per page, both families
  int32_t pages_global = 256;  // usable pages (the padding page comes on top)
  int32_t pages_local = 256;
  int32_t max_running = 64;       // requests admitted at once
  int32_t max_step_tokens = 512;  // rows per step (decode + prefill chunks)
  int32_t max_context = 0;        // 0: the model's max_position_embeddings
  int32_t max_step_failures = 4;  // consecutive failed steps a request survives, then Failed
  bool prefix_cache = true;       // share full pages of equal prefixes (DESIGN.md §2.7)
  // Batch-invariant mode (issue 16): a request's logits do not depend on what shares its
  // steps, on how its prompt is chunked, or on the decode graph bucket. The scheduler runs as
  // ever; the device must be made in the same mode (kernels::CudaDeviceOptions::batch_invariant;
  // the simulated device is batch invariant by construction). Costs throughput: perf/NOTES.md.
  bool batch_invariant = false;
  FaultInjector* faults = nullptr;
};

enum class EngineErrorCode { kBadConfig, kDevice };
using EngineError = Error<EngineErrorCode>;

class Scheduler;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>, EngineError> create(const ModelConfig& model,
                                                             const EngineConfig& config,
                                                             Device& device);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Ownership transfer. Thread-safe. Validation failures come back as a Rejected terminal in
  // the next step's outputs.
  RequestControl submit(Request request);
  // Why this request would be rejected, or nullopt. Same checks submit's step applies.
  std::optional<Terminal> validate(const Request& request) const;
  // One iteration: admit, plan, execute, commit. Call from one thread.
  StepOutputs step();
  // Thread-safe snapshot, updated at the end of every step.
  Metrics metrics() const;
  // No queued, waiting or running requests.
  bool idle() const;

  const ModelConfig& model() const;
  const EngineConfig& config() const;
  int32_t max_context() const;
  // Full invariant check of pools and request state (page conservation, frontier account,
  // window bound, pool ownership). Empty when all hold. O(pages + requests).
  std::vector<std::string> check_invariants() const;
  // Read-only view of the scheduler, for property tests and the campaign runner.
  const Scheduler& scheduler() const;

 private:
  Engine();
  struct Inbox;
  std::unique_ptr<Inbox> inbox_;
  std::unique_ptr<Scheduler> scheduler_;
  Device* device_ = nullptr;
  mutable std::mutex metrics_mutex_;
  Metrics metrics_;
};

}  // namespace twinstep::engine
