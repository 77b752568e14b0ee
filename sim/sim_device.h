// The simulated Device (DESIGN.md §2.4). It executes a StepPlan for real over host pools: each
// row's KV record (token, position) goes into its planned slot, and each logits row's next
// token is a hash of what it READS BACK through the page tables (every position for the global
// family, the window for the local one). The oracle computes the same hash from the plain
// token list, so any paging bug changes the output. A cost model drives a virtual clock, and
// named fault sites fire from a seeded plan.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/config.h"
#include "engine/device.h"
#include "engine/fault.h"
#include "sim/cost_model.h"

namespace twinstep::sim {

// Step time = base + per row + per KV record read; nanoseconds of virtual time. With
// `calibrated` set, the calibrated model (sim/cost_model.h) replaces the three terms.
// `tensor_parallel` > 1 models the model split over that many GPUs in lockstep (issue 17): the
// calibrated terms over one rank's geometry, or the per-row and per-read terms divided by the
// ranks, plus the collectives (TpComm, assumed figures). The model must split (the campaign
// checks it with engine::tensor_parallel_plan).
struct CostModel {
  int64_t base_ns = 150'000;
  int64_t per_row_ns = 2'000;
  int64_t per_kv_read_ns = 5;
  std::shared_ptr<const CalibratedCost> calibrated;
  int32_t tensor_parallel = 1;
};

// The token a logits row at `position` yields, computed from the plain token list
// (tokens[0..position] are the request's tokens, prompt then generated): a function of the sum
// of oracle_term(token, position) over every position (the global family's read) and over the
// window (the local family's), and of the sampling parameters. The device computes the same
// sums from what it reads back through the page tables, binding each record to the position it
// was read for.
int32_t oracle_next_token(std::span<const int32_t> tokens, int32_t position, int32_t window,
                          const engine::SamplingParams& sampling, int32_t output_index,
                          int32_t vocab_size);
uint64_t oracle_term(int32_t token, int32_t position);

// The simulated device's logprob model (there are no logits to soft-max): a logits row whose
// context hashes to `context_hash` (the hash the greedy token is taken from, so greedy token g
// = context_hash % vocab) ranks token t at k = (t - g) mod vocab, and p(k) = q^min(k, K) / Z
// with K = min(32, vocab), q in [0.3, 0.7) drawn from the hash and Z the sum over the
// vocabulary. logprob = ln p(k) in double, rounded to float: deterministic, normalised, the
// greedy token on top and no ties within the top K (so none within any top-n list); a sampled
// token (drawn from its own hash, not from p) reports its rank's logprob.
engine::RowLogprobs sim_logprobs(uint64_t context_hash, int32_t chosen, int32_t top_n,
                                 int32_t vocab_size);

// The same oracle over a request's growing token list in O(1) a token: prefix sums of
// oracle_term. The harness keeps one per request (the plain loop above is its own check).
class OracleDigest {
 public:
  void push(int32_t token);  // the token at position size()
  int32_t size() const { return static_cast<int32_t>(prefix_.size()) - 1; }
  // oracle_next_token(tokens, size() - 1, ...) for the tokens pushed so far.
  int32_t next_token(int32_t window, const engine::SamplingParams& sampling, int32_t output_index,
                     int32_t vocab_size) const;

 private:
  std::vector<uint64_t> prefix_ = {0};  // prefix_[k] = sum of the terms of positions < k
};

class SimDevice final : public engine::Device {
 public:
  SimDevice(const engine::ModelConfig& model, engine::FaultInjector* faults = nullptr,
            CostModel cost = {});

  std::string name() const override { return "sim"; }
  engine::Status<engine::DeviceError> bind(const engine::PoolLayout& global,
                                           const engine::PoolLayout& local) override;
  engine::Result<engine::DeviceOutput, engine::DeviceError> execute(
      const engine::StepPlan& plan) override;

  // How a row reads its context back (the output is the same either way): kPageDigests sums
  // each whole, in-place page through a digest kept as records are written, and keeps per
  // request and family the prefix sums of what its whole pages contributed, recomputed from the
  // first logical page whose page id differs from the last read's or whose page was written
  // since (a row costs a compare of its page table plus the pages that changed); kEveryRecord
  // reads every record (O(tokens) a row), the mode the fast one is tested against.
  enum class ReadMode { kPageDigests, kEveryRecord };
  void set_read_mode(ReadMode mode) { read_mode_ = mode; }
  // Whole pages read through their digest or the prefix sums so far (0 in kEveryRecord), and
  // whole-page contributions the prefix sums had to (re)compute.
  uint64_t pages_read_by_digest() const { return pages_by_digest_; }
  uint64_t pages_recomputed() const { return pages_recomputed_; }

  int64_t now_ns() const { return now_ns_; }
  // Lets a harness charge idle time (e.g. waiting for arrivals) to the virtual clock.
  void advance_ns(int64_t ns) { now_ns_ += ns; }
  uint64_t steps_executed() const { return steps_executed_; }
  // What the last execute() was handed, recorded before validation and faults: the harness
  // checks the step bounds and the failure limit against the plan itself, not the outputs.
  uint64_t plans_received() const { return plans_received_; }
  int32_t last_plan_rows() const { return last_plan_rows_; }
  const std::vector<engine::RequestId>& last_plan_requests() const { return last_plan_requests_; }

 private:
  struct Record {
    int32_t token = -1;
    int32_t position = -1;
  };
  // What a read registered on a page: memo `memo` used the page as its logical page `logical`.
  struct Watch {
    uint32_t memo = 0;
    int32_t logical = 0;
  };
  // The fast read's memo of one (request, family): the contribution of each whole logical page
  // as prefix sums. Exact for logical pages [lower, valid): pages[k] is the page read there and
  // prefix[k + 1] - prefix[k] its contribution now (a write to the page lowers valid to k).
  struct ReadMemo {
    std::vector<uint32_t> pages;   // [logical]
    std::vector<uint64_t> prefix;  // [logical + 1]
    int32_t lower = INT32_MAX;
    int32_t valid = 0;
  };
  struct HostPool {
    engine::PoolLayout layout;
    std::vector<std::vector<Watch>> watchers;  // [pages_total] the memos that read each page
    std::vector<Record> records;               // [pages_total * page_size]
    std::vector<uint64_t> terms;     // [pages_total * page_size] oracle_term of each record
    std::vector<uint64_t> page_sum;  // [pages_total] sum of the page's terms
    // A page is in place at base B when every slot o holds position B + o: page_in_place
    // counts the slots that do for page_base (the base of its latest write).
    std::vector<int32_t> page_base;      // [pages_total]
    std::vector<int32_t> page_in_place;  // [pages_total]
  };
  void write_record(HostPool& pool, int64_t slot, Record rec);
  // Logical page k's contribution read as a whole page (positions [k p, k p + p)) at `page`.
  uint64_t whole_page_term(const HostPool& pool, uint32_t page, int32_t logical) const;
  ReadMemo& memo_of(engine::RequestId request, engine::Family f);
  // Makes memo m exact over logical pages [first, need_end) of the listed table.
  void refresh(ReadMemo& m, uint32_t memo_index, HostPool& pool, const uint32_t* listed,
               int32_t first, int32_t need_end);
  uint64_t read_range(const engine::StepPlan& plan, engine::Family f, int32_t seq, int32_t from,
                      int32_t to, int64_t* reads) const;
  std::optional<engine::DeviceError> validate(const engine::StepPlan& plan) const;
  bool fire(engine::FaultSite site);
  uint64_t read_family(const engine::StepPlan& plan, engine::Family f, int32_t seq, int32_t from,
                       int32_t to, int64_t* reads);

  engine::ModelConfig model_;
  engine::FaultInjector* faults_;
  CostModel cost_;
  std::optional<CalibratedClock> clock_;          // from cost_.calibrated
  std::optional<engine::TensorParallelPlan> tp_;  // cost_.tensor_parallel > 1
  // The three-term clock's step time (base, rows and reads over the ranks, the collectives).
  int64_t three_term_ns(const engine::StepPlan& plan, int64_t reads) const;
  HostPool pools_[engine::kFamilyCount];
  bool bound_ = false;
  ReadMode read_mode_ = ReadMode::kPageDigests;
  mutable uint64_t pages_by_digest_ = 0;
  uint64_t pages_recomputed_ = 0;
  std::vector<ReadMemo> memos_;
  std::vector<uint32_t> memo_slot_;                    // [request id * 2 + family] index + 1
  std::unordered_map<uint64_t, uint32_t> memo_index_;  // the same past the dense range
  int64_t now_ns_ = 0;
  uint64_t steps_executed_ = 0;
  uint64_t plans_received_ = 0;
  int32_t last_plan_rows_ = 0;
  std::vector<engine::RequestId> last_plan_requests_;  // [plan.seqs.size()], plan order
};

}  // namespace twinstep::sim
