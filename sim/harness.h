// Harness: drives an Engine on a SimDevice and checks, after every step, everything the
// properties, the campaign and the fuzz target assert. Independent of the engine's own helpers:
// one terminal per request and nothing after it (its own ledger, and a probe that the engine's
// ledger refuses a forged update), every token against the oracle, stop and length semantics,
// the page account of both families from the reference model (sim/reference.h) and the
// frontiers the outputs reported, every configured bound (max_running, max_step_tokens, the
// consecutive-failure limit), Failed only after a fault, nothing but an Aborted terminal for a
// request aborted between steps, metrics() against pools, queues and the outputs, and a failed
// step leaving requests and queues as they were. For the prefix cache (DESIGN.md §2.7), from
// its own model: what each page holds (the digest of the tokens its writer had up to the page's
// end, recorded from every plan the device ran), so a page read through a page table must hold
// the reader's own prefix; every page's reference count against the requests holding it; the
// page states summing to the pool; and each admission's hit length against the longest hit the
// cached and held pages could serve (global: every page before it, local: the pages of the
// window before it). Then Engine::check_invariants, and a trace hash of the whole run.
#pragma once

#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/page_pool.h"
#include "sim/fault_plan.h"
#include "sim/sim_device.h"

namespace twinstep::engine {
struct RequestState;  // engine/scheduler.h
}  // namespace twinstep::engine

namespace twinstep::sim {

struct Violation {
  uint64_t step = 0;
  std::string invariant;  // short name, e.g. "page-conservation", "oracle"
  std::string detail;
};

// What the harness knows about one submitted request, from the outputs alone.
struct RequestRecord {
  engine::Request request;
  engine::RequestControl control;
  std::vector<int32_t> output;
  OracleDigest oracle;  // prompt then output: the oracle's next token in O(1)
  // The harness's digest of tokens[0..j] (prompt then output), for what a page must hold.
  std::vector<uint64_t> content;
  std::optional<engine::Terminal> terminal;
  engine::RequestPhase last_phase = engine::RequestPhase::kQueued;
  bool ever_scheduled = false;
  int32_t preemptions = 0;
  int64_t submit_ns = 0;
  int64_t first_token_ns = -1;
  int64_t last_token_ns = -1;
  std::vector<int64_t> token_gaps_ns;
  // Tracked from the outputs alone, for the reference model and the failure limit.
  int32_t frontier = 0;
  int32_t consecutive_failures = 0;  // failed steps in a row whose plan held this request
  bool abort_pending = false;        // abort() called; the next step must end it Aborted
};

class Harness;

// The device the engine is given: forwards to the SimDevice and shows the harness every plan
// and what came of it (which pages the device wrote).
class PlanTap final : public engine::Device {
 public:
  PlanTap(Harness& harness, SimDevice& device) : harness_(harness), device_(device) {}
  std::string name() const override { return device_.name(); }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override;
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override;

 private:
  Harness& harness_;
  SimDevice& device_;
};

class Harness {
 public:
  Harness(const engine::ModelConfig& model, engine::EngineConfig config, uint64_t fault_seed,
          CostModel cost = {});

  static std::optional<std::string> creation_error(const engine::ModelConfig& model,
                                                   const engine::EngineConfig& config);

  engine::RequestControl submit(engine::Request request);
  // Aborts a request by id if known (live or finished); unknown ids are a no-op, as for users.
  void abort(engine::RequestId id);
  // One engine step plus every check. Returns the outputs.
  const engine::StepOutputs& step();
  // Steps until idle or `max_steps`; false if it did not drain.
  bool drain(int64_t max_steps);
  // Pools back at zero pages held (call when idle), after the whole-state scans (unless the
  // last step ran them), so a seed's end state is always checked whole.
  void check_baseline();
  // Every step runs the incremental checks (harness_incremental.cc: the whole-state checks
  // over what the step changed). The whole-state scans (every live request's page account and
  // queue, the pools' page-by-page references and states, Engine::check_invariants, the
  // failed-step snapshot, the prefix-hit lower bound's snapshot of the cache) run at each
  // seed's end (check_baseline) and, with K >= 1 (--full-check-every K), on every K-th step as
  // well; K = 0 (the default): only at the end.
  void set_full_check_every(int32_t k);
  int32_t full_check_every() const { return full_check_every_; }
  // Off: no incremental checks, the whole-state scans on every step instead (set before the
  // first step; for comparing the two).
  void set_incremental_checks(bool on);

  engine::Engine& engine() { return *engine_; }
  SimDevice& device() { return device_; }
  FaultPlan& faults() { return faults_; }
  const std::map<engine::RequestId, RequestRecord>& records() const { return records_; }
  const std::vector<Violation>& violations() const { return violations_; }
  bool ok() const { return violations_.empty(); }
  uint64_t trace_hash() const { return trace_hash_; }
  uint64_t steps() const { return steps_; }
  // The phase a live request is in (from the scheduler); kDone once finished.
  engine::RequestPhase phase_of(engine::RequestId id) const;
  // Engine steps taken by every harness of this process (the properties report it).
  static uint64_t steps_in_process();

 private:
  void violate(std::string invariant, std::string detail);
  void check_update(const engine::RequestUpdate& update);
  void check_tokens(const engine::RequestUpdate& update, RequestRecord& rec);
  void check_terminal(const engine::RequestUpdate& update, RequestRecord& rec);
  void count_plan_failures(uint64_t plans_before);
  void check_step_bounds(uint64_t plans_before);
  void check_failure_limit();
  void check_page_account();
  void check_request_account(engine::RequestId id, const engine::RequestState& r,
                             int32_t* expected_total);
  void check_whole_state();
  void check_metrics(const engine::Metrics& m);
  void probe_engine_ledger(const engine::RequestUpdate& terminal);
  void absorb(uint64_t word);
  // records_ by id in O(1) (the engine numbers requests 1, 2, ...); nullptr when unknown.
  RequestRecord* record_of(engine::RequestId id);
  void check_queues();
  // Prefix cache checks (harness_prefix.cc).
  friend class PlanTap;
  void bind_pages(const engine::PoolLayout& global, const engine::PoolLayout& local);
  void check_plan_reads(const engine::StepPlan& plan);
  void check_seq_reads(const engine::PlanSeq& seq, engine::Family f, int32_t page_size,
                       const uint32_t* listed, int32_t first, int32_t end_k,
                       const std::vector<uint64_t>& content);
  void record_plan_writes(const engine::StepPlan& plan, bool wrote);
  void snapshot_cache();
  void check_hit(const engine::RequestUpdate& update, const RequestRecord& rec);
  void check_pool_references(const int32_t (&expected_references)[engine::kFamilyCount]);
  void check_pool_totals(const std::string& name, const engine::PagePool& pool,
                         const int32_t (&by_state)[5], int64_t references,
                         int64_t expected_references);
  // Incremental whole-state checks (harness_incremental.cc): every step, over what changed.
  // What the last step left of one live request (its fields the checks read, O(1) each).
  struct Fingerprint {
    int32_t frontier = 0;
    int32_t tokens = 0;
    int32_t last_token = 0;
    int32_t page_keys = 0;
    int32_t first_page[engine::kFamilyCount] = {};
    int32_t held[engine::kFamilyCount] = {};
    engine::RequestPhase phase = engine::RequestPhase::kQueued;
    bool operator==(const Fingerprint&) const = default;
  };
  struct LiveRequest {
    engine::RequestId id;
    const engine::RequestState* state = nullptr;  // its node in the scheduler's map
    Fingerprint seen;
    int32_t expected[engine::kFamilyCount] = {};  // the reference model's pages at seen
    uint32_t list_edits = 0;     // this step's pages entering its lists (both families)
    bool any_edit = false;       // this step edited its lists
    bool marked = false;         // this step touched it (outputs or lists): re-check it
    bool fresh = false;          // joined the table this step (nothing seen before)
    bool rechecked_all = false;  // this step re-checked every full page of it
  };
  // The pool's side of one page as the checks last saw it.
  struct PageShadow {
    engine::PagePool::PageState state = engine::PagePool::PageState::kFree;
    bool published = false;
    int32_t refs = 0;
    uint64_t hash = 0;
    uint64_t available = 0;  // the content it offers an admission (held or cached), else 0
    int32_t owners = 0;      // its holders when last checked
  };
  void init_incremental();
  void begin_incremental();   // after the outputs: the live table, the list edits, a failed step
  void finish_incremental();  // requests, queues, pages, counters
  void track_live_requests();
  void apply_list_edits();
  void check_failed_step_incremental();
  void check_dirty_page(engine::Family f, uint32_t page, bool holders_edited);
  void check_changed_request(LiveRequest& live, const Fingerprint& now);
  void check_published_range(const LiveRequest& live, engine::Family f, int32_t begin, int32_t end);
  void check_published_at(const LiveRequest& live, engine::Family f, engine::PageId page);
  void check_counters();
  void track_queues();
  void check_incremental_state();
  void check_queue_of(const LiveRequest& live);
  void mark_live(LiveRequest& live);
  void refresh_available(engine::Family f, uint32_t page);
  bool has_available(engine::Family f, uint64_t content) const;
  Fingerprint fingerprint_of(const engine::RequestState& r) const;
  LiveRequest* live_of(engine::RequestId id);

  engine::ModelConfig model_;
  engine::EngineConfig config_;  // as configured, not as the engine reports it
  FaultPlan faults_;
  SimDevice device_;
  PlanTap tap_;
  std::unique_ptr<engine::Engine> engine_;
  std::map<engine::RequestId, RequestRecord> records_;
  std::vector<RequestRecord*> record_by_id_;  // [id.value] into records_ (nodes never move)
  std::vector<uint8_t> queue_mark_;           // [id.value] the queue checks' scratch, 0 between
  std::vector<int32_t> holders_;              // check_pool_references' scratch
  std::vector<Violation> violations_;
  engine::StepOutputs last_;
  uint64_t device_faults_before_ = 0;              // FaultPlan::device_fired() before this step
  bool ledger_probed_ = false;                     // this step's engine-ledger probe ran
  std::vector<engine::RequestId> aborts_pending_;  // aborted since the last step, not ended
  // Totals of what the outputs carried, for the counters in metrics().
  uint64_t terminals_seen_[5] = {};
  uint64_t tokens_seen_ = 0;
  uint64_t preemptions_seen_ = 0;
  uint64_t steps_failed_seen_ = 0;
  int32_t pages_peak_seen_[engine::kFamilyCount] = {};
  // Per family and page index: the content digest of the page's writer at the page's end, 0
  // while the page is partly written. What held or cached pages held before this step, sorted
  // (the contents an admission could have hit), and the evictions before it.
  std::vector<uint64_t> page_content_[engine::kFamilyCount];
  std::vector<uint64_t> available_before_[engine::kFamilyCount];
  bool available_taken_ = false;  // false: no request could be admitted in this step
  bool available_sorted_ = false;
  uint64_t evictions_before_ = 0;
  uint64_t hits_seen_ = 0;
  uint64_t hit_tokens_seen_ = 0;
  // check_plan_reads' memo per (request, family): the pages it found holding the request's
  // prefix, exact over logical pages [lower, valid) while their recorded content is unchanged
  // (a change lowers valid to the logical page the content's watchers read the page as).
  struct ReadsMemo {
    std::vector<uint32_t> pages;  // [logical]
    int32_t lower = INT32_MAX;
    int32_t valid = 0;
  };
  struct ContentWatch {
    uint32_t memo = 0;
    int32_t logical = 0;
  };
  ReadsMemo& reads_memo(engine::RequestId id, engine::Family f, uint32_t* index);
  void set_page_content(engine::Family f, uint64_t page, uint64_t content);
  std::vector<ReadsMemo> reads_memos_;
  std::vector<uint32_t> reads_memo_slot_;          // [request id * 2 + family] index + 1
  std::map<uint64_t, uint32_t> reads_memo_index_;  // the same past the dense range
  std::vector<std::vector<ContentWatch>> content_watchers_[engine::kFamilyCount];  // [page]
  // Incremental checks' state: per family and page the shadow and the requests holding it
  // (from the page-list log), the counters summed over the shadows, the pages touched this
  // step, the available contents (content -> pages offering it), the live requests.
  std::vector<PageShadow> shadow_[engine::kFamilyCount];
  std::vector<std::vector<engine::RequestId>> holders_of_[engine::kFamilyCount];
  std::vector<uint32_t> touched_pages_[engine::kFamilyCount];
  std::vector<uint8_t> touched_mark_[engine::kFamilyCount];
  engine::FlatIndex available_[engine::kFamilyCount];  // content -> pages offering it
  int32_t by_state_[engine::kFamilyCount][5] = {};
  int32_t published_pages_[engine::kFamilyCount] = {};
  int64_t references_[engine::kFamilyCount] = {};
  int64_t expected_references_[engine::kFamilyCount] = {};
  std::vector<LiveRequest> live_;
  std::vector<uint32_t> live_slot_;  // [id.value] index in live_ + 1; 0: not live
  std::vector<engine::RequestId> submitted_since_step_;
  std::vector<engine::PageListEdit> edits_;  // scratch: this step's page-list edits
  std::vector<uint32_t> dirty_scratch_;      // scratch: a pool's dirty log
  std::vector<engine::RequestId> to_check_;  // this step's marked live requests
  std::vector<engine::RequestId> removed_;   // this step's ended requests
  std::vector<engine::RequestId> marks_;     // scratch: the drained request marks
  // Per request id, how many times each queue lists it, followed from the queues' edit log.
  struct QueueCount {
    int32_t running = 0;
    int32_t waiting = 0;
    bool operator==(const QueueCount&) const = default;
  };
  std::vector<QueueCount> queue_counts_;        // [id.value]
  std::vector<engine::QueueEdit> queue_edits_;  // scratch: this step's queue edits
  std::vector<std::pair<engine::RequestId, QueueCount>> queue_touched_;  // scratch: id, before
  std::vector<engine::RequestId> running_before_;  // failed-step check: the queues before
  std::vector<engine::RequestId> waiting_before_;
  bool incremental_ok_ = true;  // false: ids past the dense range; every step runs whole
  bool incremental_on_ = true;  // set_incremental_checks
  uint64_t trace_hash_ = 0x6a09e667f3bcc908ULL;
  uint64_t steps_ = 0;
  int32_t full_check_every_ = 0;  // 0: the full scans only at a seed's end
  bool full_step_ = true;         // this step runs the whole-state checks
  bool cache_snapshot_ = false;   // available_before_ was taken before this step
};

}  // namespace twinstep::sim
