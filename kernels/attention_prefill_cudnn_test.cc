// kernels/attention_prefill_cudnn_test.cc: the host half of the cuDNN prefill path: the batch
// planner (plan_cudnn_prefill) and what CudnnPrefill::create refuses before it touches cuDNN or
// the GPU. Expected entries are written out by hand from the row arrays, not recomputed with the
// planner's logic. No GPU needed.
#include "kernels/attention_prefill_cudnn.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace twinstep::kernels {
namespace {

void expect_entry(const CudnnPrefillSeq& e, int32_t seq, int32_t row_begin, int32_t q_len,
                  int32_t kv_len) {
  EXPECT_EQ(e.seq, seq);
  EXPECT_EQ(e.row_begin, row_begin);
  EXPECT_EQ(e.q_len, q_len);
  EXPECT_EQ(e.kv_len, kv_len);
}

TEST(CudnnPrefillPlan, OneEntryPerSeqWithRowsInRowOrder) {
  // A chunk of seq 2 continuing at 37, a fresh prompt of seq 0, two decode rows (seqs 4, 1).
  const std::vector<int32_t> row_seq = {2, 2, 2, 0, 0, 0, 0, 4, 1};
  const std::vector<int32_t> positions = {37, 38, 39, 0, 1, 2, 3, 700, 5};
  auto b = plan_cudnn_prefill(row_seq, positions);
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_EQ(b->entries.size(), 4u);
  expect_entry(b->entries[0], 2, 0, 3, 40);
  expect_entry(b->entries[1], 0, 3, 4, 4);
  expect_entry(b->entries[2], 4, 7, 1, 701);
  expect_entry(b->entries[3], 1, 8, 1, 6);
  EXPECT_EQ(b->rows, 9);
  EXPECT_EQ(b->max_q_len, 4);
  EXPECT_EQ(b->max_kv_len, 701);
}

TEST(CudnnPrefillPlan, RefusesWhatCudnnCannotTakeByRow) {
  auto split = plan_cudnn_prefill(std::vector<int32_t>{0, 1, 0}, std::vector<int32_t>{0, 0, 1});
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.error().code, KernelErrorCode::kBadArgument);
  EXPECT_NE(split.error().message.find("seq 0 has a second run of rows at row 2"),
            std::string::npos)
      << split.error().message;
  auto gap = plan_cudnn_prefill(std::vector<int32_t>{3, 3}, std::vector<int32_t>{9, 11});
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.error().message.find("row 1 of seq 3 is at 11, expected 10"), std::string::npos)
      << gap.error().message;
  auto negative = plan_cudnn_prefill(std::vector<int32_t>{0}, std::vector<int32_t>{-1});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message.find("position -1"), std::string::npos);
  auto sizes = plan_cudnn_prefill(std::vector<int32_t>{0, 0}, std::vector<int32_t>{0});
  ASSERT_FALSE(sizes.ok());
  EXPECT_NE(sizes.error().message.find("(2 vs 1)"), std::string::npos);
}

TEST(CudnnPrefillPlan, RowSlackIsTheRowsBucket) {
  CudnnPrefillBatch b;
  b.max_q_len = 1;
  EXPECT_EQ(CudnnPrefill::row_slack(b), 64);
  b.max_q_len = 65;
  EXPECT_EQ(CudnnPrefill::row_slack(b), 128);
  b.max_q_len = 2048;
  EXPECT_EQ(CudnnPrefill::row_slack(b), 2048);
}

// Refused before any cuDNN or CUDA call, so this runs on machines without a GPU (and in builds
// without cuDNN, where every create is refused).
TEST(CudnnPrefillCreate, RefusesGeometryItDoesNotServe) {
  const KvPoolView hd512{nullptr, 1, 8, 16, 1, 512};
  auto wide = CudnnPrefill::create(hd512, 16, 0, {4, 1024});
  ASSERT_FALSE(wide.ok());
  const KvPoolView page7{nullptr, 1, 8, 7, 2, 256};
  auto odd = CudnnPrefill::create(page7, 16, 7, {4, 1024});
  ASSERT_FALSE(odd.ok());
  const KvPoolView gqa{nullptr, 1, 8, 16, 3, 256};
  auto uneven = CudnnPrefill::create(gqa, 16, 0, {4, 1024});
  ASSERT_FALSE(uneven.ok());
  if (cudnn_compiled_in()) {
    EXPECT_NE(wide.error().message.find("head_dim 512 outside 64..256"), std::string::npos)
        << wide.error().message;
    EXPECT_NE(odd.error().message.find("page size 7"), std::string::npos) << odd.error().message;
    EXPECT_NE(uneven.error().message.find("multiple of kv_heads 3"), std::string::npos)
        << uneven.error().message;
  } else {
    EXPECT_NE(wide.error().message.find("no cuDNN in this build"), std::string::npos);
  }
}

// The serving threshold: seqs of fewer than min_q_len rows are left out (to another kernel);
// the step's row count stays, the maxima are of the entries kept, none kept is not an error,
// and a malformed plan is refused whichever seqs would be kept.
TEST(CudnnPrefillPlan, MinQLenLeavesShorterSeqsOut) {
  const std::vector<int32_t> row_seq = {2, 2, 2, 0, 0, 0, 0, 4, 1};
  const std::vector<int32_t> positions = {37, 38, 39, 0, 1, 2, 3, 700, 5};
  auto b = plan_cudnn_prefill(row_seq, positions, 3);
  ASSERT_TRUE(b.ok()) << b.error().message;
  ASSERT_EQ(b->entries.size(), 2u);
  expect_entry(b->entries[0], 2, 0, 3, 40);
  expect_entry(b->entries[1], 0, 3, 4, 4);
  EXPECT_EQ(b->rows, 9);
  EXPECT_EQ(b->max_q_len, 4);
  EXPECT_EQ(b->max_kv_len, 40);
  auto four = plan_cudnn_prefill(row_seq, positions, 4);
  ASSERT_TRUE(four.ok());
  ASSERT_EQ(four->entries.size(), 1u);
  expect_entry(four->entries[0], 0, 3, 4, 4);
  EXPECT_EQ(four->max_kv_len, 4);
  auto none = plan_cudnn_prefill(row_seq, positions, 5);
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_TRUE(none->entries.empty());
  EXPECT_EQ(none->rows, 9);
  EXPECT_EQ(none->max_q_len, 0);
  auto split = plan_cudnn_prefill(std::vector<int32_t>{0, 1, 0}, std::vector<int32_t>{0, 0, 1}, 5);
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.error().message.find("second run of rows at row 2"), std::string::npos);
}

// The serving limits are checked before any cuDNN or CUDA call.
TEST(CudnnPrefillCreate, RefusesServingLimitsThatCannotHold) {
  const KvPoolView local{nullptr, 1, 8, 16, 8, 256};
  CudnnPrefillLimits small_container{4, 1024};
  small_container.declared_pages = 4;
  auto a = CudnnPrefill::create(local, 16, 0, small_container);
  ASSERT_FALSE(a.ok());
  CudnnPrefillLimits unbounded{4, 1024};
  unbounded.keys = kCudnnServingKeys;  // fixed rows, max_rows 0
  auto b = CudnnPrefill::create(local, 16, 0, unbounded);
  ASSERT_FALSE(b.ok());
  CudnnPrefillLimits zero_q{4, 1024};
  zero_q.min_q_len = 0;
  auto c = CudnnPrefill::create(local, 16, 0, zero_q);
  ASSERT_FALSE(c.ok());
  if (cudnn_compiled_in()) {
    EXPECT_NE(a.error().message.find("declared_pages 4 < the pool's 8 pages"), std::string::npos)
        << a.error().message;
    EXPECT_NE(b.error().message.find("fixed rows need max_rows > 0"), std::string::npos)
        << b.error().message;
    EXPECT_NE(c.error().message.find("min_q_len 0"), std::string::npos) << c.error().message;
  } else {
    EXPECT_NE(a.error().message.find("no cuDNN in this build"), std::string::npos);
  }
}

}  // namespace
}  // namespace twinstep::kernels
