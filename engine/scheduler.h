// The scheduler: request table, FCFS admission with atomic dual-pool reservations, chunked
// prefill mixed with decode under a per-step token budget, plan building, commit and
// rollback, preemption by recompute, and the terminal ledger.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/page_pool.h"
#include "engine/plan.h"

namespace twinstep::engine {

struct RequestState {
  RequestId id;
  Request request;
  std::shared_ptr<std::atomic<bool>> abort_flag;
  // The fields the checks read are Marked: a write marks the request for the incremental
  // checks (bound in enqueue, once the request has its place in the table).
  RequestMarker marker;
  MarkedVector<int32_t> tokens;  // prompt, then generated tokens
  int32_t prompt_len = 0;
  Marked<int32_t> frontier = 0;  // tokens whose K/V are written, both families
  KvState kv[kFamilyCount];      // indexed by Family
  Marked<RequestPhase> phase = RequestPhase::kWaiting;
  int32_t consecutive_failures = 0;
  uint64_t admitted_seq = 0;  // admission order, for preemption victims
  // Prefix cache: the key of each full page of `tokens` computed so far (logical order), and
  // per family the logical page below which every held page is published (or shared).
  MarkedVector<uint64_t> page_keys;
  int32_t published_end[kFamilyCount] = {0, 0};

  int32_t generated() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - frontier; }
  const KvState& kv_of(Family f) const { return kv[static_cast<int>(f)]; }
  KvState& kv_of(Family f) { return kv[static_cast<int>(f)]; }
};

// "Exactly one terminal per request, nothing after it." A request may be touched only while it
// is live (or in the step it arrives); its terminal ends that. Memory is bounded by the live
// set: a retired id is simply no longer live.
class Ledger {
 public:
  void begin_step() { touched_.clear(); }
  void arrived(RequestId id) { touched_[id] = false; }
  void admitted(RequestId id) { live_.insert(id); }
  void record(const RequestUpdate& update);

 private:
  std::unordered_set<RequestId> live_;  // a lookup per update: no ordered walk needed
  std::map<RequestId, bool> touched_;   // this step's arrivals and terminals: id -> terminated
};

// Where the queues record their edits (QueueEdit: engine/kv_state.h).
struct QueueLog {
  bool on = false;  // off until a checker asks (Scheduler::record_page_list_edits)
  std::vector<QueueEdit> edits;
};

// A scheduler queue (running: a vector, waiting: a deque) read as its container and written
// only through the calls below, each entry entering or leaving recorded in the log once it is
// on, so a checker follows every request's membership from the edits alone (an id listed twice
// counts twice) and no edit escapes it.
template <class Container>
class RequestQueue {
 public:
  RequestQueue(QueueLog* log, uint8_t queue) : log_(log), queue_(queue) {}
  RequestQueue(const RequestQueue&) = delete;
  RequestQueue& operator=(const RequestQueue&) = delete;

  operator const Container&() const { return items_; }  // NOLINT: read as the container
  const Container& items() const { return items_; }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const RequestId& front() const { return items_.front(); }
  const RequestId& back() const { return items_.back(); }
  const RequestId& operator[](size_t i) const { return items_[i]; }
  typename Container::const_iterator begin() const { return items_.begin(); }
  typename Container::const_iterator end() const { return items_.end(); }

  void push_back(RequestId id) {
    items_.push_back(id);
    note(id, +1);
  }
  void push_front(RequestId id) {
    items_.push_front(id);
    note(id, +1);
  }
  void pop_front() {
    note(items_.front(), -1);
    items_.pop_front();
  }
  void pop_back() {
    note(items_.back(), -1);
    items_.pop_back();
  }
  // Removes every entry equal to `id` (std::erase); returns how many.
  size_t erase(RequestId id) {
    const size_t removed = std::erase(items_, id);
    for (size_t i = 0; i < removed; ++i) note(id, -1);
    return removed;
  }

 private:
  void note(RequestId id, int8_t delta) {
    if (log_->on) log_->edits.push_back(QueueEdit{id, queue_, delta});
  }
  Container items_;
  QueueLog* log_;
  uint8_t queue_;
};

class Scheduler {
 public:
  Scheduler(const ModelConfig& model, const EngineConfig& config, Device& device);

  // Takes a validated-or-not request from the inbox at the start of a step.
  void enqueue(RequestId id, Request request, std::shared_ptr<std::atomic<bool>> flag,
               StepOutputs* out);
  StepOutputs step(
      std::vector<std::tuple<RequestId, Request, std::shared_ptr<std::atomic<bool>>>> arrivals);
  // The engine's count of aborts asked for (RequestControl::abort bumps it after setting a
  // flag): a step looks for set flags only when it moved. Unset, every step looks.
  void set_abort_count(const std::atomic<uint64_t>* count) { abort_count_ = count; }
  std::optional<Terminal> validate(const Request& request) const;
  std::vector<std::string> check_invariants() const;
  // Tests (process-wide): every hit take_hit serves from its memo is looked up again from
  // scratch and must be the same (a TS_CHECK), and the counts below are kept: how often the
  // memo served, and how often a watched key's publish or eviction made a request that tried
  // again get a longer or a shorter hit than its memo's.
  struct HitMemoStats {
    uint64_t served = 0;
    uint64_t grew = 0;
    uint64_t shrank = 0;
  };
  static void verify_hit_memo(bool on);
  static HitMemoStats hit_memo_stats();
  Metrics metrics() const;

  const ModelConfig& model() const { return model_; }
  const EngineConfig& config() const { return config_; }
  const PagePool& pool(Family f) const { return *pools_[static_cast<int>(f)]; }
  const std::map<RequestId, RequestState>& requests() const { return requests_; }
  using WaitingQueue = RequestQueue<std::deque<RequestId>>;
  using RunningQueue = RequestQueue<std::vector<RequestId>>;
  const WaitingQueue& waiting() const { return waiting_; }
  const RunningQueue& running() const { return running_; }
  const Counters& counters() const { return counters_; }
  // Every edit of every live request's page lists since the last drain (KvState's PageList
  // records them; a request erased holding pages shows as its pages leaving). The log is the
  // checker's, not the scheduler's state (hence const).
  // Off until a checker asks (before the first request arrives); the log grows until drained.
  // The queues' edits are recorded from the same call (drain_queue_edits).
  void record_page_list_edits() const {
    page_list_log_on_ = true;
    queue_log_.on = true;
  }
  void drain_queue_edits(std::vector<QueueEdit>* out) const {
    out->insert(out->end(), queue_log_.edits.begin(), queue_log_.edits.end());
    queue_log_.edits.clear();
  }
  void drain_page_list_edits(std::vector<PageListEdit>* out) const {
    out->insert(out->end(), page_list_log_.edits.begin(), page_list_log_.edits.end());
    page_list_log_.edits.clear();
  }
  // The requests whose Marked fields were written since the last drain (with repeats).
  void drain_request_marks(std::vector<RequestId>* out) const {
    out->insert(out->end(), page_list_log_.marked.begin(), page_list_log_.marked.end());
    page_list_log_.marked.clear();
  }
  bool idle() const { return requests_.empty(); }
  int32_t max_context() const { return max_context_; }
  // Host wall time of the last step() by phase (steady clock, microseconds), for the
  // benchmarks (issue 13 item 3): arrivals, aborts and admission; the plan; the device's
  // execute(); commit, preemption and retirement.
  struct StepTimes {
    double admit_us = 0;
    double plan_us = 0;
    double device_us = 0;
    double commit_us = 0;
  };
  const StepTimes& last_step_times() const { return step_times_; }

 private:
  struct Scheduled {  // one request's share of the step
    RequestId id;
    RequestState* state = nullptr;  // requests_.at(id): stable until erase_finished()
    int32_t rows = 0;
    int32_t kv_len_before = 0;
    bool newly_admitted = false;
    RequestPhase phase_before = RequestPhase::kWaiting;
    bool produces_logits = false;
    int32_t logits_index = -1;
    std::vector<PageId> reserved[kFamilyCount];
    // A prefix hit of an admission: hit_tokens (page aligned) whose K/V are the shared pages
    // below, acquired for the step; kv_len_before already counts them. hit_ticks says where
    // each was in the eviction order, so a failed step puts them back exactly.
    int32_t hit_tokens = 0;
    int32_t hit_first_page[kFamilyCount] = {0, 0};
    std::vector<PageId> hit_pages[kFamilyCount];
    std::vector<uint64_t> hit_ticks[kFamilyCount];
    // Back to a fresh entry's values, keeping the vectors' capacity.
    void reset() {
      id = RequestId{};
      state = nullptr;
      rows = kv_len_before = hit_tokens = 0;
      newly_admitted = produces_logits = false;
      phase_before = RequestPhase::kWaiting;
      logits_index = -1;
      for (int f = 0; f < kFamilyCount; ++f) {
        reserved[f].clear();
        hit_first_page[f] = 0;
        hit_pages[f].clear();
        hit_ticks[f].clear();
      }
    }
  };
  PagePool& pool_mut(Family f) { return *pools_[static_cast<int>(f)]; }

  // Retires every aborted request; `after_commit` is the kTokenAfterAbort mutant's late pass.
  void retire_aborted(StepOutputs* out, bool after_commit);
  Scheduled& scheduled_slot();
  RequestState& running_state(size_t i);
  void schedule(bool* stalled_on_capacity);
  int32_t rows_that_fit(const RequestState& r, const Scheduled& s, int32_t wanted) const;
  int32_t end_page(const RequestState& r, const Scheduled& s, Family f) const;
  bool reserve_both(RequestState& r, int32_t rows, Scheduled* s, bool* capacity_refusal);
  // Prefix cache (scheduler_prefix.cc).
  void extend_keys(RequestState& r, int32_t pages) const;
  int32_t hit_pages(RequestState& r, int32_t* read,
                    std::vector<PageId> (&found)[kFamilyCount]) const;
  void remember_hit(RequestState& r);
  void take_hit(RequestState& r, Scheduled* s);
  void drop_hit(Scheduled& s);
  void publish_full_pages(RequestState& r);
  void check_published(const RequestState& r,
                       const std::function<void(const std::string&)>& fail) const;
  // Fills plan_ for `scheduled`, reusing the page tables of the plan it held (scheduler_plan.cc).
  void build_plan(std::span<const Scheduled> scheduled);
  void build_rows(std::span<const Scheduled> scheduled);
  void build_tables(std::span<const Scheduled> scheduled, Family f, uint64_t old_step);
  bool build_tables_in_place(std::span<const Scheduled> scheduled, Family f, uint64_t old_step);
  void build_slots(std::span<const Scheduled> scheduled, Family f);
  int64_t place_regions(FamilyPlan* fp, int64_t old_total, int64_t listed);
  void move_kept(uint32_t* pages);
  void rollback(std::span<Scheduled> scheduled, const DeviceError& error, StepOutputs* out);
  void commit(std::span<Scheduled> scheduled, const DeviceOutput& result, StepOutputs* out);
  void release_window_pages(RequestState& r);
  void release_all(RequestState& r);
  bool holds_shared_page(const RequestState& r) const;
  void finish(RequestState& r, Terminal terminal, RequestUpdate* update);
  void preempt_youngest(StepOutputs* out);
  void emit(StepOutputs* out, RequestUpdate update);
  void erase_finished();

  ModelConfig model_;
  EngineConfig config_;
  Device& device_;
  int32_t max_context_ = 0;
  std::unique_ptr<PagePool> pools_[kFamilyCount];
  // Declared before requests_ so that it outlives the page lists that write to it.
  mutable PageListLog page_list_log_;
  mutable bool page_list_log_on_ = false;
  std::map<RequestId, RequestState> requests_;  // live requests only
  mutable QueueLog queue_log_;                  // before the queues that write to it
  WaitingQueue waiting_{&queue_log_, 1};        // FCFS; preempted requests go to the front
  RunningQueue running_{&queue_log_, 0};        // admission order
  std::vector<RequestId> finished_this_step_;
  Ledger ledger_;
  Counters counters_;
  uint64_t step_index_ = 0;
  const std::atomic<uint64_t>* abort_count_ = nullptr;
  uint64_t aborts_retired_ = 0;  // the count at the last complete retire_aborted pass
  uint64_t admitted_counter_ = 0;
  // take_hit's memo of the last request it looked up (the head of the queue, which may wait for
  // many steps): exact while the request, its token count and both pools' watch generations
  // (which move when one of its keys is published or evicted) are those it was taken at.
  struct HitMemo {
    RequestId id;
    int32_t tokens = -1;
    uint64_t generation[kFamilyCount] = {0, 0};
    int32_t pages = 0;  // hit_pages()
    int32_t first[kFamilyCount] = {0, 0};
    std::vector<PageId> hit[kFamilyCount];  // the pages the hit acquires, per family
  };
  HitMemo hit_memo_;
  // The plan of the last step that ran the device, rebuilt in place (its capacity stays, so a
  // warm step allocates nothing for it); build_tables reuses its page tables.
  StepPlan plan_;
  StepTimes step_times_;
  // This step's share of each scheduled request: the first scheduled_count_ entries (the rest
  // are kept for their vectors' capacity).
  std::vector<Scheduled> scheduled_;
  size_t scheduled_count_ = 0;
  // running_state()'s memo: (running_[i], its state) as last looked up at place i.
  std::vector<std::pair<RequestId, RequestState*>> running_cache_;
  std::vector<int32_t> table_begin_old_;  // scratch: the old plan's seq_page_begin
  // A run of a seq's table entries kept from the old plan: `count` entries at `from` there
  // go to `to` in the new one.
  struct TableKeep {
    int32_t from = 0;
    int32_t to = 0;
    int32_t count = 0;
  };
  std::vector<TableKeep> table_keep_;        // scratch: per new seq
  std::vector<TableKeep> table_right_runs_;  // scratch: runs that move right
  std::vector<int32_t> table_old_seq_;       // scratch: per new seq, its kept old seq or -1
  std::vector<int64_t> table_limit_;         // scratch: per new seq, the next kept region
};

}  // namespace twinstep::engine
