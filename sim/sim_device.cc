// SimDevice: plan validation, KV record writes, read-back hashing and the oracle.
#include "sim/sim_device.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <optional>

#include "engine/mutants.h"
#include "sim/rng.h"

namespace twinstep::sim {

using engine::DeviceError;
using engine::DeviceErrorCode;
using engine::Family;
using engine::FaultSite;

namespace {

constexpr uint64_t kPoison = 0xdeadbeefcafef00dULL;

// What reading position j contributes when its record holds `rec_token` at `rec_position`:
// the record's own term when it is the record of position j, else garbage bound to j (so a
// record read through the wrong page or slot changes the sum even when the same (token,
// position) pairs are read in another order).
uint64_t read_term(int32_t j, int32_t rec_token, int32_t rec_position) {
  const uint64_t term = oracle_term(rec_token, rec_position);
  return rec_position == j ? term : mix64(term ^ kPoison ^ static_cast<uint64_t>(j));
}

// The two families' read-backs as one hash: the greedy token's, and sim_logprobs' context.
uint64_t context_hash(uint64_t global_hash, uint64_t local_hash) {
  return mix64(global_hash * 3 + local_hash);
}

// Combines the two families' read-backs and the sampling parameters into a token.
int32_t finish_token(uint64_t global_hash, uint64_t local_hash,
                     const engine::SamplingParams& sampling, int32_t output_index,
                     int32_t vocab_size) {
  uint64_t h = context_hash(global_hash, local_hash);
  if (!sampling.greedy()) {
    uint64_t draw =
        sampling.seed ^ (static_cast<uint64_t>(output_index) + 1) * 0x9e3779b97f4a7c15ULL;
    draw ^= static_cast<uint64_t>(std::bit_cast<uint32_t>(sampling.temperature)) << 1;
    draw ^= static_cast<uint64_t>(sampling.top_k) << 33;
    draw ^= static_cast<uint64_t>(std::bit_cast<uint32_t>(sampling.top_p)) << 7;
    h = mix64(h ^ mix64(draw));
  }
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size));
}

}  // namespace

uint64_t oracle_term(int32_t token, int32_t position) {
  const uint64_t word =
      (static_cast<uint64_t>(static_cast<uint32_t>(token)) << 32) | static_cast<uint32_t>(position);
  return mix64(word ^ 0x632be59bd9b4e019ULL);
}

int32_t oracle_next_token(std::span<const int32_t> tokens, int32_t position, int32_t window,
                          const engine::SamplingParams& sampling, int32_t output_index,
                          int32_t vocab_size) {
  TS_CHECK(position >= 0 && position < static_cast<int32_t>(tokens.size()))
      << "position=" << position << " tokens=" << tokens.size();
  uint64_t global_hash = 0;
  for (int32_t j = 0; j <= position; ++j) global_hash += oracle_term(tokens[j], j);
  uint64_t local_hash = 0;
  for (int32_t j = std::max(0, position - window + 1); j <= position; ++j) {
    local_hash += oracle_term(tokens[j], j);
  }
  return finish_token(global_hash, local_hash, sampling, output_index, vocab_size);
}

engine::RowLogprobs sim_logprobs(uint64_t context_hash, int32_t chosen, int32_t top_n,
                                 int32_t vocab_size) {
  TS_CHECK(vocab_size > 0 && chosen >= 0 && chosen < vocab_size && top_n >= 0)
      << "vocab=" << vocab_size << " chosen=" << chosen << " top_n=" << top_n;
  const int64_t vocab = vocab_size;
  const int64_t head = std::min<int64_t>(32, vocab);
  const double u = static_cast<double>(mix64(context_hash ^ 0x4c6f6750726f6273ULL) >> 40) /
                   static_cast<double>(1 << 24);
  const double q = 0.3 + 0.4 * u;
  // p(k) = q^min(k, K) / Z: the head's geometric sum plus vocab - K tail tokens at q^K.
  const double q_head = std::pow(q, static_cast<double>(head));
  const double log_z =
      std::log((1.0 - q_head) / (1.0 - q) + static_cast<double>(vocab - head) * q_head);
  auto logprob = [&](int64_t rank) {
    return static_cast<float>(static_cast<double>(std::min(rank, head)) * std::log(q) - log_z);
  };
  const int64_t greedy = static_cast<int64_t>(context_hash % static_cast<uint64_t>(vocab));
  engine::RowLogprobs row;
  row.logprob = logprob((chosen - greedy + vocab) % vocab);
  for (int64_t k = 0; k < std::min<int64_t>(top_n, vocab); ++k) {
    row.top.push_back({static_cast<int32_t>((greedy + k) % vocab), logprob(k)});
  }
  return row;
}

void OracleDigest::push(int32_t token) {
  const int32_t position = static_cast<int32_t>(prefix_.size()) - 1;
  prefix_.push_back(prefix_.back() + oracle_term(token, position));
}

int32_t OracleDigest::next_token(int32_t window, const engine::SamplingParams& sampling,
                                 int32_t output_index, int32_t vocab_size) const {
  const int32_t position = size() - 1;
  TS_CHECK(position >= 0) << "no token to continue from";
  const int32_t first = std::max(0, position - window + 1);
  return finish_token(prefix_[position + 1], prefix_[position + 1] - prefix_[first], sampling,
                      output_index, vocab_size);
}

SimDevice::SimDevice(const engine::ModelConfig& model, engine::FaultInjector* faults,
                     CostModel cost)
    : model_(model), faults_(faults), cost_(cost) {
  if (cost_.tensor_parallel > 1) {
    auto tp = engine::tensor_parallel_plan(model_, cost_.tensor_parallel);
    TS_CHECK(tp.ok()) << tp.error().message;
    tp_ = tp.value();
  }
  if (cost_.calibrated != nullptr) {
    clock_.emplace(model_, cost_.calibrated, tp_ ? &*tp_ : nullptr);
  }
}

int64_t SimDevice::three_term_ns(const engine::StepPlan& plan, int64_t reads) const {
  const int32_t rows = plan.num_rows();
  const int64_t ranks = tp_ ? tp_->ranks : 1;
  const double comm = tp_ ? TpComm{}.step_ns(model_, *tp_, rows, plan.num_logits,
                                             plan.logits_feed_greedy_ids_only())
                          : 0.0;
  return cost_.base_ns + (cost_.per_row_ns * rows + cost_.per_kv_read_ns * reads) / ranks +
         std::llround(comm);
}

engine::Status<DeviceError> SimDevice::bind(const engine::PoolLayout& global,
                                            const engine::PoolLayout& local) {
  if (global.family != Family::kGlobal || local.family != Family::kLocal ||
      global.page_size != local.page_size || global.page_size <= 0) {
    return engine::unexpected(DeviceError{DeviceErrorCode::kBadLayout,
                                          "expected a global and a local layout of one page size"});
  }
  for (const engine::PoolLayout& layout : {global, local}) {
    HostPool& pool = pools_[static_cast<int>(layout.family)];
    pool.layout = layout;
    pool.records.assign(static_cast<size_t>(layout.pages_total) * layout.page_size, Record{});
    for (int32_t i = 0; i < layout.page_size; ++i) pool.records[i] = Record{-2, -2};  // padding
    // Digests of the initial records; no page starts in place (base INT32_MIN matches no slot).
    pool.terms.resize(pool.records.size());
    pool.page_sum.assign(layout.pages_total, 0);
    pool.page_base.assign(layout.pages_total, INT32_MIN);
    pool.page_in_place.assign(layout.pages_total, 0);
    pool.watchers.assign(layout.pages_total, {});
    for (size_t slot = 0; slot < pool.records.size(); ++slot) {
      pool.terms[slot] = oracle_term(pool.records[slot].token, pool.records[slot].position);
      pool.page_sum[slot / layout.page_size] += pool.terms[slot];
    }
  }
  memos_.clear();
  memo_index_.clear();
  memo_slot_.clear();
  bound_ = true;
  return engine::Ok{};
}

std::optional<DeviceError> SimDevice::validate(const engine::StepPlan& plan) const {
  auto bad = [](std::string message) {
    return DeviceError{DeviceErrorCode::kBadPlan, std::move(message)};
  };
  if (!bound_) return bad("execute() before bind()");
  const int32_t rows = plan.num_rows();
  if (static_cast<int32_t>(plan.positions.size()) != rows ||
      static_cast<int32_t>(plan.row_seq.size()) != rows) {
    return bad("plan arrays disagree on the row count");
  }
  for (int32_t i = 0; i < rows; ++i) {
    if (plan.tokens[i] < 0 || plan.tokens[i] >= model_.vocab_size) {
      return bad("row " + std::to_string(i) + " token " + std::to_string(plan.tokens[i]) +
                 " is outside the vocabulary [0, " + std::to_string(model_.vocab_size) + ")");
    }
  }
  for (const Family f : engine::kFamilies) {
    const engine::FamilyPlan& fp = plan.family(f);
    const HostPool& pool = pools_[static_cast<int>(f)];
    if (fp.pool != pool.layout.tag) {
      return bad(std::string(engine::family_name(f)) + " plan names pool " +
                 std::to_string(fp.pool.value) + ", device holds pool " +
                 std::to_string(pool.layout.tag.value));
    }
    if (static_cast<int32_t>(fp.row_slot.size()) != rows ||
        fp.seq_page_begin.size() != plan.seqs.size() + 1 ||
        fp.seq_page_count.size() != plan.seqs.size()) {
      return bad(std::string(engine::family_name(f)) + " plan arrays have the wrong length");
    }
    // Each seq's table: a first logical page >= 0 and a region of page_indices whose first
    // seq_page_count entries it lists (the reads index both; a corrupted scheduler must get an
    // error, not a read outside them).
    if (fp.seq_first_page.size() != plan.seqs.size()) {
      return bad(std::string(engine::family_name(f)) + " plan has " +
                 std::to_string(fp.seq_first_page.size()) + " first pages for " +
                 std::to_string(plan.seqs.size()) + " seqs");
    }
    for (size_t s = 0; s < plan.seqs.size(); ++s) {
      const int32_t begin = fp.seq_page_begin[s], end = fp.seq_page_begin[s + 1];
      const int32_t count = fp.seq_page_count[s];
      if (fp.seq_first_page[s] < 0 || begin < 0 || end < begin ||
          end > static_cast<int32_t>(fp.page_indices.size()) || count < 0 || count > end - begin) {
        return bad(std::string(engine::family_name(f)) + " seq " + std::to_string(s) +
                   " lists pages [" + std::to_string(begin) + ", " + std::to_string(end) + ") of " +
                   std::to_string(fp.page_indices.size()) + " from logical page " +
                   std::to_string(fp.seq_first_page[s]) + ", " + std::to_string(count) +
                   " of them listed (expected a first page >= 0, a range inside the table and "
                   "at most its size listed)");
      }
    }
    // Every listed page in [1, pages_total): page - 1 < pages_total - 1 unsigned, or'd over
    // each seq's list (one vectorised pass; the search for the first bad one only when there
    // is one). A region's slack is not listed, not read, not checked.
    const uint32_t usable = static_cast<uint32_t>(pool.layout.pages_total) - 1;
    uint32_t outside = 0;
    for (size_t s = 0; s < plan.seqs.size(); ++s) {
      const uint32_t* pages = fp.page_indices.data() + fp.seq_page_begin[s];
      const size_t n = static_cast<size_t>(fp.seq_page_count[s]);
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {  // a fixed trip count: vectorised at -O2 too
        for (size_t k = 0; k < 8; ++k) outside |= (pages[i + k] - 1u) >= usable ? 1u : 0u;
      }
      for (; i < n; ++i) outside |= (pages[i] - 1u) >= usable ? 1u : 0u;
    }
    if (outside != 0) {
      for (size_t s = 0; s < plan.seqs.size(); ++s) {
        for (int32_t i = 0; i < fp.seq_page_count[s]; ++i) {
          const uint32_t page = fp.page_indices[fp.seq_page_begin[s] + i];
          if (page - 1u < usable) continue;
          return bad(std::string(engine::family_name(f)) + " page " + std::to_string(page) +
                     " outside [1, " + std::to_string(pool.layout.pages_total) + ")");
        }
      }
    }
    // Slots in [page_size, records): past the padding page, inside the pool (none when the
    // plan's page size is not in [0, records]).
    const int64_t records = static_cast<int64_t>(pool.records.size());
    const uint64_t slots = plan.page_size >= 0 && plan.page_size <= records
                               ? static_cast<uint64_t>(records - plan.page_size)
                               : 0;
    uint32_t slot_outside = 0;
    for (const int64_t slot : fp.row_slot) {
      slot_outside |= static_cast<uint64_t>(slot - plan.page_size) >= slots ? 1u : 0u;
    }
    if (slot_outside != 0) {
      for (const int64_t slot : fp.row_slot) {
        if (static_cast<uint64_t>(slot - plan.page_size) < slots) continue;
        return bad(std::string(engine::family_name(f)) + " write slot " + std::to_string(slot) +
                   " outside the pool");
      }
    }
  }
  return std::nullopt;
}

bool SimDevice::fire(FaultSite site) { return faults_ != nullptr && faults_->fire(site); }

// Positions [from, to] of seq `seq` read back through the family's page table, record by
// record (kEveryRecord) or, for pages wholly inside the range and in place, through the page's
// digest (kPageDigests): the same sum either way.
uint64_t SimDevice::read_range(const engine::StepPlan& plan, Family f, int32_t seq, int32_t from,
                               int32_t to, int64_t* reads) const {
  const engine::FamilyPlan& fp = plan.family(f);
  const HostPool& pool = pools_[static_cast<int>(f)];
  const int32_t p = plan.page_size;
  const int32_t begin = fp.seq_page_begin[seq];
  const int32_t listed = fp.seq_page_count[seq];
  uint64_t h = 0;
  for (int32_t j = from; j <= to;) {
    const int32_t logical = j / p - fp.seq_first_page[seq];
    const int32_t page_end = std::min(to, (j / p + 1) * p - 1);  // last position of this page
    if (logical < 0 || logical >= listed) {
      // A page the plan does not list: garbage, as on a real device.
      for (; j <= page_end; ++j) h += mix64(kPoison ^ static_cast<uint64_t>(j));
      continue;
    }
    const int64_t page = fp.page_indices[begin + logical];
    *reads += page_end - j + 1;
    if (read_mode_ == ReadMode::kPageDigests && j % p == 0 && page_end - j + 1 == p &&
        pool.page_base[page] == j && pool.page_in_place[page] == p) {
      h += pool.page_sum[page];
      pages_by_digest_ += 1;
      j = page_end + 1;
      continue;
    }
    for (; j <= page_end; ++j) {
      const Record& rec = pool.records[page * p + j % p];
      h += read_term(j, rec.token, rec.position);
    }
  }
  return h;
}

uint64_t SimDevice::whole_page_term(const HostPool& pool, uint32_t page, int32_t logical) const {
  const int32_t p = pool.layout.page_size;
  const int32_t base = logical * p;
  if (pool.page_base[page] == base && pool.page_in_place[page] == p) return pool.page_sum[page];
  uint64_t h = 0;
  for (int32_t o = 0; o < p; ++o) {
    const Record& rec = pool.records[int64_t{page} * p + o];
    h += read_term(base + o, rec.token, rec.position);
  }
  return h;
}

SimDevice::ReadMemo& SimDevice::memo_of(engine::RequestId request, Family f) {
  const uint64_t key = request.value * 2 + static_cast<uint64_t>(f);
  if (key < (uint64_t{1} << 27)) {  // dense ids: a flat index (slot + 1; 0 = none yet)
    if (memo_slot_.size() <= key) memo_slot_.resize(key + 1, 0);
    if (memo_slot_[key] == 0) {
      memos_.emplace_back();
      memo_slot_[key] = static_cast<uint32_t>(memos_.size());
    }
    return memos_[memo_slot_[key] - 1];
  }
  auto [it, inserted] = memo_index_.try_emplace(key, static_cast<uint32_t>(memos_.size()));
  if (inserted) memos_.emplace_back();
  return memos_[it->second];
}

// The memo's pages [first, s) still match the table and are valid; [s, need_end) are
// recomputed and watched. A table that starts below the memo's lower bound (a request that
// restarted) is recomputed whole.
void SimDevice::refresh(ReadMemo& m, uint32_t memo_index, HostPool& pool, const uint32_t* listed,
                        int32_t first, int32_t need_end) {
  if (static_cast<int32_t>(m.pages.size()) < need_end) {
    m.pages.resize(need_end, 0);
    m.prefix.resize(static_cast<size_t>(need_end) + 1, 0);
  }
  int32_t s = first < m.lower ? first : std::max(first, std::min(m.valid, need_end));
  if (s > first && std::memcmp(&m.pages[first], listed, sizeof(uint32_t) * (s - first)) != 0) {
    s = static_cast<int32_t>(std::mismatch(&m.pages[first], &m.pages[s], listed).first -
                             m.pages.data());
  }
  if (s >= need_end) return;
  for (int32_t k = s; k < need_end; ++k) {
    const uint32_t page = listed[k - first];
    m.pages[k] = page;
    m.prefix[k + 1] = m.prefix[k] + whole_page_term(pool, page, k);
    pool.watchers[page].push_back(Watch{memo_index, k});
  }
  pages_recomputed_ += need_end - s;
  m.lower = std::min(m.lower, s);
  m.valid = need_end;
}

// kPageDigests: the run of whole listed pages inside [from, to] through the memo's prefix
// sums, the partial pages at either end (and any unlisted ones) through read_range.
uint64_t SimDevice::read_family(const engine::StepPlan& plan, Family f, int32_t seq, int32_t from,
                                int32_t to, int64_t* reads) {
  if (read_mode_ != ReadMode::kPageDigests) return read_range(plan, f, seq, from, to, reads);
  const engine::FamilyPlan& fp = plan.family(f);
  HostPool& pool = pools_[static_cast<int>(f)];
  const int32_t p = plan.page_size;
  const int32_t first = fp.seq_first_page[seq];
  const int32_t listed = fp.seq_page_count[seq];
  const int32_t run_lo = std::max((from + p - 1) / p, first);
  const int32_t run_hi = std::min((to + 1) / p, first + listed);
  if (run_lo >= run_hi) return read_range(plan, f, seq, from, to, reads);
  ReadMemo& m = memo_of(plan.seqs[seq].request, f);
  const uint32_t memo_index = static_cast<uint32_t>(&m - memos_.data());
  refresh(m, memo_index, pool, &fp.page_indices[fp.seq_page_begin[seq]], first, run_hi);
  uint64_t h = m.prefix[run_hi] - m.prefix[run_lo];
  *reads += int64_t{run_hi - run_lo} * p;
  pages_by_digest_ += run_hi - run_lo;
  if (from < run_lo * p) h += read_range(plan, f, seq, from, run_lo * p - 1, reads);
  if (run_hi * p <= to) h += read_range(plan, f, seq, run_hi * p, to, reads);
  return h;
}

void SimDevice::write_record(HostPool& pool, int64_t slot, Record rec) {
  const int32_t p = pool.layout.page_size;
  const int64_t page = slot / p;
  const int32_t o = static_cast<int32_t>(slot % p);
  // The memos that read this page are exact no further than the logical page they read it as.
  for (const Watch& w : pool.watchers[page]) {
    memos_[w.memo].valid = std::min(memos_[w.memo].valid, w.logical);
  }
  pool.watchers[page].clear();
  const uint64_t term = oracle_term(rec.token, rec.position);
  pool.page_sum[page] += TS_MUTANT(kDigestKeepsOverwritten) ? term : term - pool.terms[slot];
  pool.terms[slot] = term;
  const bool was_in_place = pool.records[slot].position - o == pool.page_base[page];
  pool.records[slot] = rec;
  if (rec.position - o == pool.page_base[page]) {
    pool.page_in_place[page] += was_in_place ? 0 : 1;
    return;
  }
  // A write for another base (the page was handed to another seq or logical page): recount
  // against the new base, once per such move.
  pool.page_base[page] = rec.position - o;
  pool.page_in_place[page] = 0;
  for (int32_t i = 0; i < p; ++i) {
    pool.page_in_place[page] += pool.records[page * p + i].position - i == pool.page_base[page];
  }
}

engine::Result<engine::DeviceOutput, DeviceError> SimDevice::execute(const engine::StepPlan& plan) {
  plans_received_ += 1;
  last_plan_rows_ = plan.num_rows();
  last_plan_requests_.clear();
  for (const engine::PlanSeq& seq : plan.seqs) last_plan_requests_.push_back(seq.request);
  if (auto error = validate(plan)) return engine::unexpected(std::move(*error));
  // A failed step still costs time: the base cost, plus the rows once they were launched.
  auto fault = [&](FaultSite site) {
    const bool launched = site == FaultSite::kAfterKvWrite || site == FaultSite::kSync;
    if (clock_) {
      now_ns_ += launched ? clock_->step_ns(plan) : clock_->refused_ns();
    } else {
      now_ns_ += launched ? three_term_ns(plan, 0) : cost_.base_ns;
    }
    return engine::unexpected(DeviceError{
        DeviceErrorCode::kFault, "injected fault at " + std::string(fault_site_name(site)), site});
  };
  if (fire(FaultSite::kUpload)) return fault(FaultSite::kUpload);
  if (fire(FaultSite::kLaunch)) return fault(FaultSite::kLaunch);
  for (const Family f : engine::kFamilies) {
    HostPool& pool = pools_[static_cast<int>(f)];
    const engine::FamilyPlan& fp = plan.family(f);
    for (int32_t i = 0; i < plan.num_rows(); ++i) {
      write_record(pool, fp.row_slot[i], Record{plan.tokens[i], plan.positions[i]});
    }
  }
  if (fire(FaultSite::kAfterKvWrite)) return fault(FaultSite::kAfterKvWrite);
  engine::DeviceOutput out;
  out.sampled.assign(plan.num_logits, -1);
  int64_t reads = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(plan.seqs.size()); ++s) {
    const engine::PlanSeq& seq = plan.seqs[s];
    if (seq.logits_index < 0) continue;
    const int32_t position = seq.kv_len_before + seq.row_count - 1;
    const uint64_t gh = read_family(plan, Family::kGlobal, s, 0, position, &reads);
    const uint64_t lh = read_family(
        plan, Family::kLocal, s, std::max(0, position - plan.sliding_window + 1), position, &reads);
    const int32_t token = finish_token(gh, lh, seq.sampling, seq.output_index, model_.vocab_size);
    out.sampled[seq.logits_index] = token;
    if (seq.sampling.top_logprobs >= 0) {
      out.logprobs.resize(plan.num_logits);
      out.logprobs[seq.logits_index] =
          sim_logprobs(context_hash(gh, lh), token, seq.sampling.top_logprobs, model_.vocab_size);
    }
  }
  if (fire(FaultSite::kSync)) return fault(FaultSite::kSync);
  out.cost_ns = clock_ ? clock_->step_ns(plan) : three_term_ns(plan, reads);
  now_ns_ += out.cost_ns;
  steps_executed_ += 1;
  return out;
}

}  // namespace twinstep::sim
