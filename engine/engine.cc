// Engine: the thread-safe face of the scheduler (inbox for submit, metrics snapshot).
#include "engine/engine.h"

#include <tuple>

#include "engine/scheduler.h"

namespace twinstep::engine {

const char* terminal_kind_name(TerminalKind kind) {
  switch (kind) {
    case TerminalKind::kStop:
      return "stop";
    case TerminalKind::kLength:
      return "length";
    case TerminalKind::kAborted:
      return "aborted";
    case TerminalKind::kRejected:
      return "rejected";
    case TerminalKind::kFailed:
      return "failed";
  }
  return "?";
}

const char* reject_reason_name(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone:
      return "none";
    case RejectReason::kEmptyPrompt:
      return "empty_prompt";
    case RejectReason::kZeroMaxTokens:
      return "zero_max_tokens";
    case RejectReason::kExceedsContext:
      return "exceeds_context";
    case RejectReason::kTokenOutOfVocab:
      return "token_out_of_vocab";
    case RejectReason::kNeverFits:
      return "never_fits";
    case RejectReason::kBadSampling:
      return "bad_sampling";
  }
  return "?";
}

const char* request_phase_name(RequestPhase phase) {
  switch (phase) {
    case RequestPhase::kQueued:
      return "queued";
    case RequestPhase::kWaiting:
      return "waiting";
    case RequestPhase::kPrefill:
      return "prefill";
    case RequestPhase::kDecode:
      return "decode";
    case RequestPhase::kPreempted:
      return "preempted";
    case RequestPhase::kDone:
      return "done";
  }
  return "?";
}

Counters& Counters::operator+=(const Counters& o) {
  submitted += o.submitted;
  for (int i = 0; i < 5; ++i) terminals[i] += o.terminals[i];
  for (int i = 0; i < kRejectReasonCount; ++i) rejections[i] += o.rejections[i];
  tokens_generated += o.tokens_generated;
  prompt_tokens_computed += o.prompt_tokens_computed;
  steps += o.steps;
  steps_failed += o.steps_failed;
  preemptions += o.preemptions;
  window_pages_released += o.window_pages_released;
  chunked_prefills += o.chunked_prefills;
  admission_waits += o.admission_waits;
  for (int i = 0; i < kRequestPhaseCount; ++i) aborts_by_phase[i] += o.aborts_by_phase[i];
  prefix_hits += o.prefix_hits;
  prefix_hit_tokens += o.prefix_hit_tokens;
  hits_rolled_back += o.hits_rolled_back;
  shared_page_aborts += o.shared_page_aborts;
  shared_page_preemptions += o.shared_page_preemptions;
  return *this;
}

struct Engine::Inbox {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::vector<std::tuple<RequestId, Request, std::shared_ptr<std::atomic<bool>>>> arrivals;
  // Aborts asked for through the controls: shared with them (a control may outlive the engine).
  std::shared_ptr<std::atomic<uint64_t>> aborts = std::make_shared<std::atomic<uint64_t>>(0);
};

Engine::Engine() = default;
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>, EngineError> Engine::create(const ModelConfig& model,
                                                            const EngineConfig& config,
                                                            Device& device) {
  auto bad = [](std::string message) {
    return unexpected(EngineError{EngineErrorCode::kBadConfig, std::move(message)});
  };
  if (config.page_size <= 0) return bad("page_size must be positive");
  if (config.pages_global <= 0 || config.pages_local <= 0) {
    return bad("pages_global and pages_local must be positive");
  }
  if (config.max_running <= 0) return bad("max_running must be positive");
  if (config.max_step_tokens <= 0) return bad("max_step_tokens must be positive");
  if (config.max_step_failures <= 0) return bad("max_step_failures must be positive");
  if (config.max_context < 0) return bad("max_context must be >= 0 (0: the model's)");
  if (model.vocab_size <= 0 || model.sliding_window <= 0 || model.layer_types.empty()) {
    return bad("model config is empty (vocab_size, sliding_window and layer_types are required)");
  }
  std::unique_ptr<Engine> engine(new Engine());
  engine->inbox_ = std::make_unique<Inbox>();
  engine->scheduler_ = std::make_unique<Scheduler>(model, config, device);
  engine->scheduler_->set_abort_count(engine->inbox_->aborts.get());
  const Scheduler& s = *engine->scheduler_;
  auto bound = device.bind(s.pool(Family::kGlobal).layout(), s.pool(Family::kLocal).layout());
  if (!bound) {
    return unexpected(
        EngineError{EngineErrorCode::kDevice,
                    "device " + device.name() + " refused the pools: " + bound.error().message});
  }
  engine->device_ = &device;
  engine->metrics_ = s.metrics();
  engine->metrics_.device = device.stats();
  return engine;
}

RequestControl Engine::submit(Request request) {
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::lock_guard lock(inbox_->mutex);
  const RequestId id{inbox_->next_id++};
  inbox_->arrivals.emplace_back(id, std::move(request), flag);
  return RequestControl(id, std::move(flag), inbox_->aborts);
}

std::optional<Terminal> Engine::validate(const Request& request) const {
  return scheduler_->validate(request);
}

StepOutputs Engine::step() {
  decltype(inbox_->arrivals) arrivals;
  {
    std::lock_guard lock(inbox_->mutex);
    arrivals.swap(inbox_->arrivals);
  }
  StepOutputs out = scheduler_->step(std::move(arrivals));
  Metrics snapshot = scheduler_->metrics();
  {
    std::lock_guard lock(inbox_->mutex);
    snapshot.waiting += static_cast<int32_t>(inbox_->arrivals.size());
  }
  snapshot.device = device_->stats();
  std::lock_guard lock(metrics_mutex_);
  metrics_ = snapshot;
  return out;
}

Metrics Engine::metrics() const {
  std::lock_guard lock(metrics_mutex_);
  return metrics_;
}

bool Engine::idle() const {
  std::lock_guard lock(inbox_->mutex);
  return inbox_->arrivals.empty() && scheduler_->idle();
}

const ModelConfig& Engine::model() const { return scheduler_->model(); }
const EngineConfig& Engine::config() const { return scheduler_->config(); }
int32_t Engine::max_context() const { return scheduler_->max_context(); }
std::vector<std::string> Engine::check_invariants() const { return scheduler_->check_invariants(); }
const Scheduler& Engine::scheduler() const { return *scheduler_; }

}  // namespace twinstep::engine
