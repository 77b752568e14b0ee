// kernels/plan_check.cc: host validation of a StepPlan before any upload or launch; see
// plan_check.h for the list of checks.
#include "kernels/plan_check.h"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace twinstep::kernels {
namespace {

using engine::DeviceError;
using engine::DeviceErrorCode;
using engine::FamilyPlan;
using engine::PoolLayout;
using engine::StepPlan;

class Failure {
 public:
  template <class T>
  Failure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  Status<DeviceError> status() const {
    return unexpected(DeviceError{DeviceErrorCode::kBadPlan, "bad plan: " + os_.str()});
  }

 private:
  std::ostringstream os_;
};

#define PLAN_REQUIRE(cond, ...) \
  do {                          \
    if (!(cond)) {              \
      Failure f;                \
      f << __VA_ARGS__;         \
      return f.status();        \
    }                           \
  } while (0)

// Who lists each page of a family in the plan being checked: one entry per pool page, reused
// across plans (a page is current when its epoch is this check's), so the sharing checks are
// O(pages listed) with no allocation once the table has grown to the pool.
struct PageMark {
  uint32_t epoch = 0;
  int32_t last_seq = -1;  // the last seq that listed it
  int32_t listings = 0;   // how many seqs list it
};
struct PageMarks {
  std::vector<PageMark> marks;
  uint32_t epoch = 0;
  // A fresh epoch over `pages` entries.
  void begin(int32_t pages) {
    if (marks.size() < static_cast<size_t>(pages)) marks.resize(pages);
    if (++epoch == 0) {  // wrapped: forget every old mark
      std::fill(marks.begin(), marks.end(), PageMark{});
      epoch = 1;
    }
  }
};

Status<DeviceError> check_rows(const StepPlan& plan, int32_t vocab_size) {
  const size_t rows = plan.tokens.size();
  PLAN_REQUIRE(plan.positions.size() == rows && plan.row_seq.size() == rows,
               "positions (" << plan.positions.size() << ") and row_seq (" << plan.row_seq.size()
                             << ") must have one entry per row (" << rows << ")");
  for (size_t r = 0; r < rows; ++r) {
    PLAN_REQUIRE(plan.tokens[r] >= 0 && plan.tokens[r] < vocab_size,
                 "row " << r << " token " << plan.tokens[r] << " outside the vocabulary [0, "
                        << vocab_size << ")");
    PLAN_REQUIRE(plan.row_seq[r] >= 0 && static_cast<size_t>(plan.row_seq[r]) < plan.seqs.size(),
                 "row " << r << " row_seq " << plan.row_seq[r] << " outside [0, "
                        << plan.seqs.size() << ")");
  }
  std::vector<bool> logits_seen(std::max(0, plan.num_logits), false);
  int32_t logits = 0;
  for (size_t s = 0; s < plan.seqs.size(); ++s) {
    const engine::PlanSeq& seq = plan.seqs[s];
    PLAN_REQUIRE(seq.row_count >= 1 && seq.row_begin >= 0 &&
                     static_cast<size_t>(seq.row_begin) + seq.row_count <= rows,
                 "seq " << s << " rows [" << seq.row_begin << ", +" << seq.row_count
                        << ") must be non-empty and inside [0, " << rows << ")");
    PLAN_REQUIRE(seq.kv_len_before >= 0,
                 "seq " << s << " kv_len_before " << seq.kv_len_before << " must be >= 0");
    for (int32_t i = 0; i < seq.row_count; ++i) {
      const size_t r = seq.row_begin + i;
      PLAN_REQUIRE(plan.row_seq[r] == static_cast<int32_t>(s), "row " << r << " lies in seq " << s
                                                                      << "'s span but row_seq says "
                                                                      << plan.row_seq[r]);
      PLAN_REQUIRE(plan.positions[r] == seq.kv_len_before + i,
                   "row " << r << " (seq " << s << ") position " << plan.positions[r]
                          << ", expected kv_len_before + " << i << " = " << seq.kv_len_before + i);
    }
    if (seq.logits_index >= 0) {
      PLAN_REQUIRE(seq.logits_index < plan.num_logits && !logits_seen[seq.logits_index],
                   "seq " << s << " logits_index " << seq.logits_index
                          << " must be unique and < num_logits " << plan.num_logits);
      logits_seen[seq.logits_index] = true;
      ++logits;
    }
  }
  PLAN_REQUIRE(logits == plan.num_logits,
               "num_logits " << plan.num_logits << " but " << logits << " seqs ask for logits");
  return Ok{};
}

Status<DeviceError> check_family(const StepPlan& plan, const FamilyPlan& fam,
                                 const PoolLayout& layout) {
  const char* name = engine::family_name(layout.family);
  const size_t seqs = plan.seqs.size();
  const int32_t ps = layout.page_size;
  PLAN_REQUIRE(ps == plan.page_size,
               name << " pool page_size " << ps << " != plan page_size " << plan.page_size);
  PLAN_REQUIRE(fam.seq_page_begin.size() == seqs + 1 && fam.seq_first_page.size() == seqs,
               name << " seq_page_begin (" << fam.seq_page_begin.size()
                    << ") must have seqs+1 = " << seqs + 1 << " entries and seq_first_page ("
                    << fam.seq_first_page.size() << ") seqs = " << seqs);
  PLAN_REQUIRE(fam.seq_page_count.size() == seqs,
               name << " seq_page_count (" << fam.seq_page_count.size()
                    << ") must have seqs = " << seqs << " entries");
  PLAN_REQUIRE(fam.row_slot.size() == plan.tokens.size(),
               name << " row_slot has " << fam.row_slot.size() << " entries, expected one per "
                    << "row (" << plan.tokens.size() << ")");
  PLAN_REQUIRE(fam.seq_page_begin[0] == 0 &&
                   static_cast<size_t>(fam.seq_page_begin[seqs]) == fam.page_indices.size(),
               name << " seq_page_begin must run from 0 to page_indices.size() = "
                    << fam.page_indices.size());
  // Seqs may share pages they only read (prefix cache); a page a row writes belongs to one seq;
  // no seq lists a page twice. Each seq's list is range-checked in the same pass that marks it
  // (one pass over the pages: at 16 x 32k this check is most of the device's host time).
  thread_local PageMarks marks;
  marks.begin(layout.pages_total);

  for (size_t s = 0; s < seqs; ++s) {
    const engine::PlanSeq& seq = plan.seqs[s];
    // The seq's region [begin, next): its listed pages first, then slack nothing reads. With
    // seq_page_begin[0] == 0 and [seqs] == page_indices.size(), non-decreasing begins keep
    // every region inside page_indices.
    const int32_t begin = fam.seq_page_begin[s];
    const int32_t next = fam.seq_page_begin[s + 1];
    const int32_t count = fam.seq_page_count[s];
    const int32_t first = fam.seq_first_page[s];
    PLAN_REQUIRE(next >= begin, name << " seq " << s << " region [" << begin << ", " << next
                                     << ") of page_indices runs backwards; expected "
                                     << "seq_page_begin non-decreasing");
    PLAN_REQUIRE(count >= 0 && first >= 0,
                 name << " seq " << s << " lists " << count << " pages from logical page " << first
                      << "; expected a non-negative count and first page");
    PLAN_REQUIRE(count <= next - begin, name << " seq " << s << " lists " << count
                                             << " pages in a region of " << next - begin
                                             << " entries [" << begin << ", " << next << ")");
    const int32_t p_first = seq.kv_len_before;
    const int32_t p_last = seq.kv_len_before + seq.row_count - 1;
    const bool windowed = layout.family == engine::Family::kLocal && plan.sliding_window > 0;
    const int32_t lo = windowed ? std::max(0, p_first - plan.sliding_window + 1) : 0;
    PLAN_REQUIRE(first <= lo / ps && first + count - 1 >= p_last / ps,
                 name << " seq " << s << " lists logical pages [" << first << ", " << first + count
                      << ") but its rows read keys " << lo << ".." << p_last << ", i.e. pages ["
                      << lo / ps << ", " << p_last / ps + 1 << ")");
    const uint32_t pages_total = static_cast<uint32_t>(layout.pages_total);
    for (int32_t i = begin; i < begin + count; ++i) {
      const uint32_t page = fam.page_indices[i];
      PLAN_REQUIRE(page >= 1 && page < pages_total, name << " page_indices[" << i << "] = " << page
                                                         << " outside [1, " << pages_total << ")");
      PageMark& m = marks.marks[page];
      if (m.epoch != marks.epoch) {
        m = PageMark{marks.epoch, static_cast<int32_t>(s), 1};
        continue;
      }
      PLAN_REQUIRE(m.last_seq != static_cast<int32_t>(s),
                   name << " seq " << s << " lists page " << fam.page_indices[i] << " twice");
      m.last_seq = static_cast<int32_t>(s);
      m.listings += 1;
    }
    for (int32_t i = 0; i < seq.row_count; ++i) {
      const int32_t r = seq.row_begin + i;
      const int32_t p = plan.positions[r];
      const int64_t expected =
          static_cast<int64_t>(fam.page_indices[begin + p / ps - first]) * ps + p % ps;
      PLAN_REQUIRE(fam.row_slot[r] == expected,
                   name << " row " << r << " (seq " << s << ", position " << p << ") row_slot "
                        << fam.row_slot[r] << ", expected " << expected);
    }
  }
  for (size_t r = 0; r < fam.row_slot.size(); ++r) {
    // The slot's page was checked against the seq's own list above: it is in [1, pages_total).
    const uint32_t page = static_cast<uint32_t>(fam.row_slot[r] / ps);
    const PageMark& m = marks.marks[page];
    const int32_t listed = m.epoch == marks.epoch ? m.listings : 0;
    PLAN_REQUIRE(listed == 1, name << " page " << page << ", written by row " << r << ", is listed "
                                   << listed << " times (a written page is one seq's)");
  }
  return Ok{};
}

#undef PLAN_REQUIRE

}  // namespace

Status<DeviceError> check_plan(const StepPlan& plan, const PoolLayout& global,
                               const PoolLayout& local, int32_t vocab_size) {
  if (auto s = check_rows(plan, vocab_size); !s.ok()) return s;
  if (auto s = check_family(plan, plan.global, global); !s.ok()) return s;
  return check_family(plan, plan.local, local);
}

}  // namespace twinstep::kernels
