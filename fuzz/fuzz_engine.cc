// libFuzzer target: decodes bytes into an engine configuration and a sequence of operations
// (submit valid or malformed requests, some with a stop id they will meet, abort, step, force
// or rate faults), runs them through the Harness, which checks every invariant after every
// step (stop semantics, bounds, the reference page account, metrics, ...), then drains fault-free
// and requires every request to reach a terminal with both pools back at baseline. Any violation
// (or a TS_CHECK inside the engine) aborts, which is what libFuzzer reports as a crash.
// The same entry point is linked into a g++ replay driver (replay_main.cc).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/config.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "sim/harness.h"
#include "sim/workload.h"

namespace twinstep::fuzz {
namespace {

// Reads bytes front to back; an exhausted input reads as zeros, so every input is valid.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr int kMaxOps = 400;
constexpr int kMaxPromptTokens = 300;

engine::Request decode_request(Bytes& in, int32_t vocab, int32_t window) {
  engine::Request r;
  const uint8_t shape = in.u8();
  const int32_t len = in.u8() % kMaxPromptTokens;  // 0: an empty prompt, rejected
  const uint16_t base = in.u16();
  for (int32_t i = 0; i < len; ++i) {
    r.prompt.push_back(static_cast<int32_t>((base + i * 7 + (shape & 3) * i * i) % vocab));
  }
  if ((shape & 0x10) && !r.prompt.empty()) r.prompt.back() = vocab + (shape >> 5);  // OOV
  r.max_tokens = in.u8() % 48;                                                      // 0: rejected
  if (shape & 0x04) {
    r.sampling.temperature = (shape & 0x08) ? -1.0f : 0.7f;  // negative: bad sampling
    r.sampling.seed = base;
    r.sampling.top_k = shape >> 6;
  }
  if (shape & 0x40) {
    // Odd: a stop id the request really meets (the oracle's k-th token), so stop semantics are
    // exercised, on the first token too; even: any token id.
    const uint16_t stop = in.u16();
    if ((stop & 1) && !r.prompt.empty()) {
      r.stop_ids.push_back(sim::oracle_outputs(r, 1 + (stop >> 1) % 8, window, vocab).back());
    } else {
      r.stop_ids.push_back(static_cast<int32_t>(stop % vocab));
    }
  }
  return r;
}

[[noreturn]] void report(const sim::Harness& h, const char* phase) {
  for (const sim::Violation& v : h.violations()) {
    std::fprintf(stderr, "twinstep-fuzz: %s phase, step %llu [%s] %s\n", phase,
                 static_cast<unsigned long long>(v.step), v.invariant.c_str(), v.detail.c_str());
  }
  std::abort();
}

void run(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  engine::ModelConfig model = engine::ModelConfig::preset("sim-tiny").value();
  model.sliding_window = 1 + in.u8() % 80;
  engine::EngineConfig config;
  config.page_size = 1 + in.u8() % 16;
  config.pages_global = 1 + in.u8();
  config.pages_local = 1 + in.u8() % 64;
  config.max_running = 1 + in.u8() % 12;
  config.max_step_tokens = 1 + in.u8() * 2;
  config.max_step_failures = 1 + in.u8() % 4;
  config.max_context = in.u8() % 4 == 0 ? 64 + in.u8() * 4 : 0;
  sim::Harness h(model, config, in.u16());

  std::vector<engine::RequestId> ids;
  for (int op = 0; op < kMaxOps && !in.empty(); ++op) {
    const uint8_t code = in.u8();
    switch (code % 8) {
      case 0:
      case 1:
        ids.push_back(h.submit(decode_request(in, model.vocab_size, model.sliding_window)).id());
        break;
      case 2:  // submitted and aborted before any step: the queued phase
        ids.push_back(h.submit(decode_request(in, model.vocab_size, model.sliding_window)).id());
        h.abort(ids.back());
        break;
      case 3:
        if (!ids.empty()) h.abort(ids[in.u8() % ids.size()]);
        break;
      case 4:
        h.faults().force_once(static_cast<engine::FaultSite>(in.u8() % engine::kFaultSiteCount));
        break;
      case 5:
        h.faults().set_rate_ppm(static_cast<engine::FaultSite>(in.u8() % engine::kFaultSiteCount),
                                in.u8() * 1000u);
        break;
      default:
        for (int i = 0, n = 1 + (code >> 4); i < n; ++i) h.step();
        break;
    }
    if (!h.ok()) report(h, "operations");
  }
  // Liveness: no faults, no aborts; every request must finish and the pools must empty.
  h.faults().clear();
  int64_t work = 0;
  for (const auto& [id, r] : h.engine().scheduler().requests()) {
    work += static_cast<int64_t>(r.tokens.size()) + r.request.max_tokens;
  }
  for (const auto& [id, rec] : h.records()) {
    if (!rec.terminal) work += static_cast<int64_t>(rec.request.prompt.size()) + 48;
  }
  if (!h.drain(4 * work + 1000)) {
    std::fprintf(stderr, "twinstep-fuzz: did not drain in %lld fault-free steps\n",
                 static_cast<long long>(4 * work + 1000));
    std::abort();
  }
  h.check_baseline();
  if (!h.ok()) report(h, "liveness");
}

}  // namespace
}  // namespace twinstep::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  twinstep::fuzz::run(data, size);
  return 0;
}
