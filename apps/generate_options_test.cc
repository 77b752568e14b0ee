// apps/generate_options_test.cc: twinstep-generate's flags, --batch-invariant first (issue 16:
// twinstep-serve's flag had a parse test, this one did not).
#include "apps/generate_options.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace twinstep::apps {
namespace {

std::vector<std::string> base() {
  return {"--model", "sim-tiny", "--prompt-ids", "2,17,99;5,6", "--max-tokens", "4"};
}

std::vector<std::string> with(std::vector<std::string> args,
                              std::initializer_list<std::string> more) {
  args.insert(args.end(), more);
  return args;
}

TEST(GenerateOptions, BatchInvariantIsOffUnlessAsked) {
  auto off = parse_generate_args(base(), /*with_cuda=*/false);
  ASSERT_TRUE(off.ok()) << off.error();
  EXPECT_FALSE(off->batch_invariant);
  auto on =
      parse_generate_args(with(base(), {"--batch-invariant", "--max-step-tokens", "7"}), false);
  ASSERT_TRUE(on.ok()) << on.error();
  EXPECT_TRUE(on->batch_invariant);
  EXPECT_EQ(on->max_step_tokens, 7);
  // The flag anywhere on the line, before the required ones.
  std::vector<std::string> first = {"--batch-invariant"};
  const std::vector<std::string> rest = base();
  first.insert(first.end(), rest.begin(), rest.end());
  auto early = parse_generate_args(first, false);
  ASSERT_TRUE(early.ok()) << early.error();
  EXPECT_TRUE(early->batch_invariant);
}

TEST(GenerateOptions, BatchInvariantTakesNoValue) {
  auto valued = parse_generate_args(with(base(), {"--batch-invariant=on"}), false);
  ASSERT_FALSE(valued.ok());
  EXPECT_NE(valued.error().find("unknown argument '--batch-invariant=on'"), std::string::npos)
      << valued.error();
}

TEST(GenerateOptions, TensorParallelNeedsCudaAndARankCountInRange) {
  auto one = parse_generate_args(base(), /*with_cuda=*/true);
  ASSERT_TRUE(one.ok()) << one.error();
  EXPECT_EQ(one->tensor_parallel, 1);
  EXPECT_EQ(one->tp_transport, "nccl");
  auto two = parse_generate_args(
      with(base(), {"--tensor-parallel", "2", "--tp-transport", "loopback"}), true);
  ASSERT_TRUE(two.ok()) << two.error();
  EXPECT_EQ(two->tensor_parallel, 2);
  EXPECT_EQ(two->tp_transport, "loopback");
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--tensor-parallel", "0"}, "--tensor-parallel must be in [1, 16], got 0"},
      {{"--tensor-parallel", "17"}, "--tensor-parallel must be in [1, 16], got 17"},
      {{"--tensor-parallel", "2", "--tp-transport", "mpi"},
       "--tp-transport must be 'nccl' or 'loopback', got 'mpi'"},
      {{"--tensor-parallel", "2", "--device", "sim"}, "--tensor-parallel needs --device cuda"},
      {{"--tensor-parallel", "2", "--batch-invariant"}, "do not go together"},
  };
  for (const auto& [more, message] : bad) {
    std::vector<std::string> args = base();
    args.insert(args.end(), more.begin(), more.end());
    auto o = parse_generate_args(args, true);
    ASSERT_FALSE(o.ok()) << message;
    EXPECT_NE(o.error().find(message), std::string::npos) << o.error();
  }
}

TEST(GenerateOptions, ParsesPromptsAndSampling) {
  auto o = parse_generate_args(with(base(), {"--temperature", "0.5", "--top-k", "40",
                                             "--sample-seed", "9", "--device", "sim"}),
                               false);
  ASSERT_TRUE(o.ok()) << o.error();
  ASSERT_EQ(o->prompts.size(), 2u);
  EXPECT_EQ(o->prompts[0], (std::vector<int32_t>{2, 17, 99}));
  EXPECT_EQ(o->prompts[1], (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(o->max_tokens, 4);
  EXPECT_FLOAT_EQ(o->sampling.temperature, 0.5f);
  EXPECT_EQ(o->sampling.top_k, 40);
  EXPECT_EQ(o->sampling.seed, 9u);
  EXPECT_EQ(o->device, "sim");
}

TEST(GenerateOptions, DefaultDeviceFollowsTheBuild) {
  auto cuda = parse_generate_args(base(), /*with_cuda=*/true);
  ASSERT_TRUE(cuda.ok()) << cuda.error();
  EXPECT_EQ(cuda->device, "cuda");
  auto refused = parse_generate_args(with(base(), {"--device", "cuda"}), /*with_cuda=*/false);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("no CUDA"), std::string::npos) << refused.error();
}

TEST(GenerateOptions, UsageErrorsNameTheFlagAndTheValue) {
  auto bad_int = parse_generate_args(with(base(), {"--page-size", "16x"}), false);
  ASSERT_FALSE(bad_int.ok());
  EXPECT_NE(bad_int.error().find("--page-size expects an integer, got '16x'"), std::string::npos)
      << bad_int.error();
  auto missing = parse_generate_args(with(base(), {"--seed"}), false);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("--seed needs a value"), std::string::npos) << missing.error();
  auto no_model = parse_generate_args({"--prompt-ids", "2", "--max-tokens", "1"}, false);
  ASSERT_FALSE(no_model.ok());
  EXPECT_NE(no_model.error().find("--model is required"), std::string::npos) << no_model.error();
  auto help = parse_generate_args({"--help"}, false);
  ASSERT_TRUE(help.ok()) << help.error();
  EXPECT_TRUE(help->help);
}

}  // namespace
}  // namespace twinstep::apps
