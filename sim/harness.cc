// Harness: the per-step checks shared by properties, the campaign and the fuzzer.
#include "sim/harness.h"

#include <sstream>

#include "engine/scheduler.h"

namespace twinstep::sim {

using engine::Family;
using engine::RequestPhase;
using engine::TerminalKind;

std::optional<std::string> Harness::creation_error(const engine::ModelConfig& model,
                                                   const engine::EngineConfig& config) {
  SimDevice probe(model);
  auto engine = engine::Engine::create(model, config, probe);
  if (!engine) return engine.error().message;
  return std::nullopt;
}

Harness::Harness(const engine::ModelConfig& model, engine::EngineConfig config, uint64_t fault_seed,
                 CostModel cost)
    : model_(model), faults_(fault_seed), device_(model, &faults_, cost) {
  config.faults = &faults_;
  auto engine = engine::Engine::create(model, config, device_);
  TS_CHECK(engine.ok()) << "harness: " << engine.error().message;
  engine_ = std::move(engine.value());
}

void Harness::absorb(uint64_t word) { trace_hash_ = mix64(trace_hash_ ^ word) + 0x9e37u; }

void Harness::violate(std::string invariant, std::string detail) {
  violations_.push_back(Violation{steps_, std::move(invariant), std::move(detail)});
}

engine::RequestControl Harness::submit(engine::Request request) {
  engine::RequestControl control = engine_->submit(request);
  RequestRecord record;
  record.request = std::move(request);
  record.control = control;
  record.submit_ns = device_.now_ns();
  records_.emplace(control.id(), std::move(record));
  absorb(0x5b00 ^ control.id().value);
  return control;
}

void Harness::abort(engine::RequestId id) {
  auto it = records_.find(id);
  if (it != records_.end()) {
    it->second.last_phase = phase_of(id);
    it->second.control.abort();
  }
  absorb(0xab00 ^ id.value);
}

RequestPhase Harness::phase_of(engine::RequestId id) const {
  const auto& live = engine_->scheduler().requests();
  auto it = live.find(id);
  if (it != live.end()) return it->second.phase;
  auto rec = records_.find(id);
  if (rec != records_.end() && rec->second.terminal) return RequestPhase::kDone;
  return RequestPhase::kQueued;
}

void Harness::check_update(const engine::RequestUpdate& update) {
  auto it = records_.find(update.id);
  if (it == records_.end()) {
    std::ostringstream os;
    os << "update for " << update.id << ", which was never submitted";
    violate("ledger", os.str());
    return;
  }
  RequestRecord& rec = it->second;
  if (rec.terminal) {
    std::ostringstream os;
    os << update.id << " got an update after its terminal "
       << terminal_kind_name(rec.terminal->kind);
    violate("ledger", os.str());
    return;
  }
  if (update.scheduled_tokens > 0) rec.ever_scheduled = true;
  if (update.preempted) rec.preemptions += 1;
  for (const int32_t token : update.new_tokens) {
    std::vector<int32_t> all = rec.request.prompt;
    all.insert(all.end(), rec.output.begin(), rec.output.end());
    const int32_t expected = oracle_next_token(
        all, static_cast<int32_t>(all.size()) - 1, model_.sliding_window, rec.request.sampling,
        static_cast<int32_t>(rec.output.size()), model_.vocab_size);
    if (token != expected) {
      std::ostringstream os;
      os << update.id << " output[" << rec.output.size() << "] = " << token << ", oracle says "
         << expected;
      violate("oracle", os.str());
    }
    rec.output.push_back(token);
    const int64_t now = device_.now_ns();
    if (rec.first_token_ns < 0) {
      rec.first_token_ns = now;
    } else {
      rec.token_gaps_ns.push_back(now - rec.last_token_ns);
    }
    rec.last_token_ns = now;
  }
  if (rec.request.max_tokens > 0 &&
      static_cast<int32_t>(rec.output.size()) > rec.request.max_tokens) {
    std::ostringstream os;
    os << update.id << " emitted " << rec.output.size() << " tokens, max_tokens "
       << rec.request.max_tokens;
    violate("max-tokens", os.str());
  }
  if (update.terminal) {
    rec.terminal = update.terminal;
    const TerminalKind kind = update.terminal->kind;
    if (kind == TerminalKind::kLength &&
        static_cast<int32_t>(rec.output.size()) != rec.request.max_tokens) {
      violate("terminal", "length terminal before max_tokens");
    }
    if (kind == TerminalKind::kAborted && !rec.control.abort_requested()) {
      violate("terminal", "aborted terminal without an abort");
    }
  }
}

const engine::StepOutputs& Harness::step() {
  steps_ += 1;
  last_ = engine_->step();
  absorb(last_.step_index);
  absorb(last_.failed ? 0xfa11 : 0x0c);
  absorb(static_cast<uint64_t>(last_.rows));
  for (const engine::RequestUpdate& update : last_.updates) {
    absorb(update.id.value);
    absorb(static_cast<uint64_t>(update.scheduled_tokens) << 32 |
           static_cast<uint32_t>(update.kv_len));
    for (const int32_t t : update.new_tokens) absorb(static_cast<uint64_t>(t) + 0x70);
    if (update.preempted) absorb(0x9e);
    if (update.terminal) absorb(0x7e00 + static_cast<uint64_t>(update.terminal->kind));
    check_update(update);
  }
  const engine::Metrics m = engine_->metrics();
  absorb(static_cast<uint64_t>(m.global.pages_used) << 32 |
         static_cast<uint32_t>(m.local.pages_used));
  for (std::string& v : engine_->check_invariants()) violate("state", std::move(v));
  return last_;
}

bool Harness::drain(int64_t max_steps) {
  for (int64_t i = 0; i < max_steps && !engine_->idle(); ++i) step();
  return engine_->idle();
}

void Harness::check_baseline() {
  const engine::Metrics m = engine_->metrics();
  for (const Family f : engine::kFamilies) {
    if (m.family(f).pages_used != 0) {
      violate("baseline", std::string(engine::family_name(f)) + " pool holds " +
                              std::to_string(m.family(f).pages_used) + " pages after drain");
    }
  }
  for (const auto& [id, rec] : records_) {
    if (!rec.terminal) {
      std::ostringstream os;
      os << id << " never reached a terminal";
      violate("liveness", os.str());
    }
  }
}

}  // namespace twinstep::sim
