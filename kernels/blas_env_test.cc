// kernels/blas_env_test.cc: the decode A/B switches' parsers, host only: TWINSTEP_SKINNY
// (parse_skinny_choice, gemm_skinny.h) and TWINSTEP_DECODE_PDL (resolve_programmatic_decode,
// cuda_device.h): every accepted form and the refusals, each naming the value.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda_device.h"
#include "kernels/gemm_skinny.h"

namespace twinstep::kernels {
namespace {

TEST(SkinnyChoice, AcceptsRowsAndFlagsInAnyOrder) {
  struct Case {
    const char* value;
    int32_t rows;
    bool programmatic, streamed;
    int32_t unit_k;
  };
  const Case cases[] = {{"0", 0, true, true, 0},
                        {"16", 16, true, true, 0},
                        {"8,plain", 8, false, true, 0},
                        {"16,registers", 16, true, false, 0},
                        {"1,plain,registers", 1, false, false, 0},
                        {"4,registers,plain", 4, false, false, 0},
                        {"16,k256", 16, true, true, 256},
                        {"2,k256,plain", 2, false, true, 256}};
  for (const Case& c : cases) {
    auto got = parse_skinny_choice(c.value);
    ASSERT_TRUE(got.ok()) << c.value << ": " << got.error().message;
    EXPECT_EQ(got.value().max_rows, c.rows) << c.value;
    EXPECT_EQ(got.value().programmatic, c.programmatic) << c.value;
    EXPECT_EQ(got.value().streamed, c.streamed) << c.value;
    EXPECT_EQ(got.value().unit_k, c.unit_k) << c.value;
  }
}

TEST(SkinnyChoice, RefusesWhatItDoesNotKnowByName) {
  for (const char* value : {"", "17", "-1", "x", "16,", "16,plain,plain", "16,stream", "16 ",
                            ",plain", "16,registers,registers", "99999999999999999999",
                            "16,k256,k256", "16,k256,registers", "16,k128"}) {
    auto got = parse_skinny_choice(value);
    ASSERT_FALSE(got.ok()) << "accepted \"" << value << "\"";
    EXPECT_EQ(got.error().code, KernelErrorCode::kBadArgument);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_SKINNY=\"") + value + "\""),
              std::string::npos)
        << got.error().message;
    EXPECT_NE(got.error().message.find("ROWS[,plain][,registers][,k256]"), std::string::npos)
        << got.error().message;
  }
}

TEST(ProgrammaticDecodeOption, EnvironmentOverridesTheOptionBothWays) {
  CudaDeviceOptions off;
  off.programmatic_decode = false;
  CudaDeviceOptions on;
  on.programmatic_decode = true;
  // On by default since session 8's H200 A/B (faster at every decode batch measured).
  EXPECT_TRUE(CudaDeviceOptions{}.programmatic_decode) << "on by default";
  EXPECT_FALSE(resolve_programmatic_decode(off, nullptr).value());
  EXPECT_TRUE(resolve_programmatic_decode(on, nullptr).value());
  EXPECT_FALSE(resolve_programmatic_decode(off, "").value()) << "empty is unset";
  EXPECT_TRUE(resolve_programmatic_decode(on, "").value()) << "empty is unset";
  EXPECT_TRUE(resolve_programmatic_decode(off, "1").value());
  EXPECT_FALSE(resolve_programmatic_decode(on, "0").value());
  for (const char* bad : {"on", "2", "true", " 1", "1 "}) {
    auto got = resolve_programmatic_decode(on, bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_DECODE_PDL=") + bad + ":"),
              std::string::npos)
        << got.error().message;
  }
}

TEST(GemmTuneInGraphsOption, EnvironmentOverridesTheOptionBothWays) {
  CudaDeviceOptions off;
  off.gemm_tune_in_graphs = false;
  CudaDeviceOptions on;
  on.gemm_tune_in_graphs = true;
  EXPECT_FALSE(CudaDeviceOptions{}.gemm_tune_in_graphs) << "off by default (session 9's A/B)";
  EXPECT_FALSE(resolve_gemm_tune_in_graphs(off, nullptr).value());
  EXPECT_TRUE(resolve_gemm_tune_in_graphs(on, nullptr).value());
  EXPECT_FALSE(resolve_gemm_tune_in_graphs(off, "").value()) << "empty is unset";
  EXPECT_TRUE(resolve_gemm_tune_in_graphs(off, "1").value());
  EXPECT_FALSE(resolve_gemm_tune_in_graphs(on, "0").value());
  for (const char* bad : {"yes", "-1", " 0"}) {
    auto got = resolve_gemm_tune_in_graphs(on, bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_GEMM_TUNE_GRAPHS=") + bad + ":"),
              std::string::npos)
        << got.error().message;
  }
}

}  // namespace
}  // namespace twinstep::kernels
