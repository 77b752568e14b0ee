// kernels/plan_check_test.cc: the host plan check accepts a well-formed two-family plan and
// rejects, naming the field, each kind of out-of-range or inconsistent entry. No GPU needed.
#include "kernels/plan_check.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace twinstep::kernels {
namespace {

using engine::Family;
using engine::PoolLayout;
using engine::StepPlan;

constexpr int32_t kPage = 4;
constexpr int32_t kWindow = 6;
constexpr int32_t kVocab = 100;

PoolLayout layout(Family f, int32_t pages_total) {
  PoolLayout l;
  l.family = f;
  l.page_size = kPage;
  l.kv_heads = 1;
  l.head_dim = 64;
  l.layers = 1;
  l.pages_total = pages_total;
  return l;
}

// Seq 0: a prompt chunk at positions 8..10 (kv_len_before 8). Seq 1: one decode row at 13.
// Global lists every page from 0; local drops pages wholly behind the window of the first row.
StepPlan valid_plan() {
  StepPlan p;
  p.page_size = kPage;
  p.sliding_window = kWindow;
  p.tokens = {5, 6, 7, 9};
  p.positions = {8, 9, 10, 13};
  p.row_seq = {0, 0, 0, 1};
  p.seqs.resize(2);
  p.seqs[0].row_begin = 0;
  p.seqs[0].row_count = 3;
  p.seqs[0].kv_len_before = 8;
  p.seqs[0].logits_index = 0;
  p.seqs[1].row_begin = 3;
  p.seqs[1].row_count = 1;
  p.seqs[1].kv_len_before = 13;
  p.seqs[1].logits_index = 1;
  p.num_logits = 2;
  // Global: seq 0 pages for logical 0,1,2 -> 3,7,1; seq 1 logical 0..3 -> 2,4,5,6.
  p.global.family = Family::kGlobal;
  p.global.page_indices = {3, 7, 1, 2, 4, 5, 6};
  p.global.seq_page_begin = {0, 3, 7};
  p.global.seq_page_count = {3, 4};
  p.global.seq_first_page = {0, 0};
  p.global.row_slot = {1 * kPage + 0, 1 * kPage + 1, 1 * kPage + 2, 6 * kPage + 1};
  // Local: seq 0 first row 8 reads from 3 -> logical pages 0..2; seq 1 row 13 reads from 8
  // -> logical pages 2..3.
  p.local.family = Family::kLocal;
  p.local.page_indices = {2, 5, 1, 4, 3};
  p.local.seq_page_begin = {0, 3, 5};
  p.local.seq_page_count = {3, 2};
  p.local.seq_first_page = {0, 2};
  p.local.row_slot = {1 * kPage + 0, 1 * kPage + 1, 1 * kPage + 2, 3 * kPage + 1};
  return p;
}

std::string check_error(const StepPlan& p) {
  auto s = check_plan(p, layout(Family::kGlobal, 8), layout(Family::kLocal, 6), kVocab);
  if (s.ok()) return "";
  EXPECT_EQ(s.error().code, engine::DeviceErrorCode::kBadPlan);
  return s.error().message;
}

TEST(PlanCheck, AcceptsAWellFormedPlan) { EXPECT_EQ(check_error(valid_plan()), ""); }

// A prefix hit: seq 1 reads seq 0's first page (3) as its own logical page 0; neither writes it.
TEST(PlanCheck, AcceptsAPageSharedForReading) {
  StepPlan p = valid_plan();
  p.global.page_indices[3] = 3;
  EXPECT_EQ(check_error(p), "");
}

// The same plan with slack after each seq's list (global) and before the last region's end
// (local): the slack holds values no list may (the padding page, a page past the pool, a page
// another seq writes) and is never read.
StepPlan plan_with_slack() {
  StepPlan p = valid_plan();
  p.global.page_indices = {3, 7, 1, 0, 9, 2, 4, 5, 6, 1};
  p.global.seq_page_begin = {0, 5, 10};
  p.local.page_indices = {2, 5, 1, 4, 3, 6, 3};
  p.local.seq_page_begin = {0, 3, 7};
  return p;
}

TEST(PlanCheck, AcceptsSlackAndNeverReadsIt) { EXPECT_EQ(check_error(plan_with_slack()), ""); }

// dense_page_table drops the slack: the lists of the slack plan are the valid plan's table.
TEST(PlanCheck, DenseTableOfASlackPlanIsTheTableWithoutSlack) {
  const StepPlan slack = plan_with_slack();
  const StepPlan dense = valid_plan();
  for (const Family f : engine::kFamilies) {
    const engine::FamilyPlan& fp = slack.family(f);
    EXPECT_EQ(fp.pages_listed(), static_cast<int64_t>(dense.family(f).page_indices.size()));
    std::vector<uint32_t> pages(static_cast<size_t>(fp.pages_listed()), 0xffffffffu);
    std::vector<int32_t> begin(fp.seq_page_count.size() + 1, -1);
    fp.dense_page_table(pages.data(), begin.data());
    EXPECT_EQ(pages, dense.family(f).page_indices) << engine::family_name(f);
    EXPECT_EQ(begin, dense.family(f).seq_page_begin) << engine::family_name(f);
  }
}

struct Corruption {
  const char* what;
  std::function<void(StepPlan&)> apply;
  const char* expect;  // a substring of the message
};

TEST(PlanCheck, RejectsEachCorruptionNamingIt) {
  const Corruption cases[] = {
      {"token past vocab", [](StepPlan& p) { p.tokens[2] = kVocab; }, "token 100"},
      {"negative token", [](StepPlan& p) { p.tokens[0] = -1; }, "outside the vocabulary"},
      {"padding page listed", [](StepPlan& p) { p.global.page_indices[4] = 0; },
       "page_indices[4] = 0"},
      {"page past the pool", [](StepPlan& p) { p.local.page_indices[0] = 6; },
       "local page_indices[0] = 6 outside [1, 6)"},
      {"slot in the wrong page", [](StepPlan& p) { p.global.row_slot[3] = 5 * kPage + 1; },
       "row 3"},
      {"slot at the wrong offset", [](StepPlan& p) { p.local.row_slot[0] += 1; }, "row_slot"},
      {"position gap", [](StepPlan& p) { p.positions[1] = 10; }, "position 10"},
      {"row in another seq's span", [](StepPlan& p) { p.row_seq[1] = 1; }, "row_seq says 1"},
      {"row_seq out of range", [](StepPlan& p) { p.row_seq[3] = 2; }, "row_seq 2"},
      {"global page missing", [](StepPlan& p) { p.global.seq_first_page[1] = 1; }, "global seq 1"},
      {"local window page released too early", [](StepPlan& p) { p.local.seq_first_page[0] = 1; },
       "local seq 0"},
      {"last page not listed",
       [](StepPlan& p) {
         p.global.page_indices.pop_back();
         p.global.seq_page_begin[2] = 6;
       },
       "global seq 1"},
      {"a page one seq writes listed by another", [](StepPlan& p) { p.global.page_indices[3] = 1; },
       "written by row 0, is listed 2 times"},
      {"a page listed twice by one seq", [](StepPlan& p) { p.global.page_indices[4] = 2; },
       "seq 1 lists page 2 twice"},
      {"short row_slot", [](StepPlan& p) { p.local.row_slot.pop_back(); }, "row_slot has 3"},
      {"bad seq_page_begin", [](StepPlan& p) { p.global.seq_page_begin[2] = 9; },
       "seq_page_begin must run"},
      {"no seq_page_count", [](StepPlan& p) { p.local.seq_page_count.pop_back(); },
       "local seq_page_count (1) must have seqs = 2"},
      {"negative count", [](StepPlan& p) { p.global.seq_page_count[0] = -1; },
       "global seq 0 lists -1 pages"},
      {"count past its region", [](StepPlan& p) { p.global.seq_page_count[0] = 4; },
       "global seq 0 lists 4 pages in a region of 3 entries [0, 3)"},
      {"regions running backwards",
       [](StepPlan& p) {
         p.local.seq_page_begin = {0, 6, 5};
       },
       "local seq 1 region [6, 5) of page_indices runs backwards"},
      {"too few pages listed for the rows", [](StepPlan& p) { p.global.seq_page_count[1] = 3; },
       "global seq 1 lists logical pages [0, 3)"},
      {"duplicate logits index", [](StepPlan& p) { p.seqs[1].logits_index = 0; }, "logits_index 0"},
      {"page size mismatch", [](StepPlan& p) { p.page_size = 8; }, "page_size"},
  };
  for (const Corruption& c : cases) {
    StepPlan p = valid_plan();
    c.apply(p);
    const std::string message = check_error(p);
    EXPECT_NE(message.find(c.expect), std::string::npos)
        << c.what << ": expected a message containing '" << c.expect << "', got '" << message
        << "'";
  }
}

}  // namespace
}  // namespace twinstep::kernels
