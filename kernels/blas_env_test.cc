// kernels/blas_env_test.cc: the decode A/B switches' parsers, host only: TWINSTEP_SKINNY
// (parse_skinny_choice, gemm_skinny.h), TWINSTEP_DECODE_PDL (resolve_programmatic_decode,
// cuda_device.h), TWINSTEP_GEMM_TUNE_GRAPHS, TWINSTEP_DECODE_GRAPH_PIECES and
// TWINSTEP_DECODE_SPLITS_MAX (parse_decode_splits_max, attention_decode_split.h): every accepted
// form and the refusals, each naming the value; and the layers the graph pieces are cut at.
#include <gtest/gtest.h>

#include <string>

#include "kernels/attention_decode_split.h"
#include "kernels/cuda_device.h"
#include "kernels/decode_graphs.h"
#include "kernels/gemm_gated.h"
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
    EXPECT_EQ(got.value().min_rows, 1) << c.value;
    EXPECT_EQ(got.value().max_weight_bytes, 0) << c.value;
  }
  auto ranged = parse_skinny_choice("9-16,k256,wmax=64");
  ASSERT_TRUE(ranged.ok()) << ranged.error().message;
  EXPECT_EQ(ranged.value().min_rows, 9);
  EXPECT_EQ(ranged.value().max_rows, 16);
  EXPECT_EQ(ranged.value().unit_k, 256);
  EXPECT_EQ(ranged.value().max_weight_bytes, int64_t{64} << 20);
  auto gated = parse_skinny_choice("1-16,k256,gated");
  ASSERT_TRUE(gated.ok()) << gated.error().message;
  EXPECT_TRUE(gated.value().gated);
  EXPECT_TRUE(gated.value().streamed);
  EXPECT_FALSE(ranged.value().gated) << "gated only when asked";
  EXPECT_EQ(ranged.value().norm_max_rows, 0) << "no folded norm unless asked";
  auto folded = parse_skinny_choice("1-16,norm=2,k256,gated");
  ASSERT_TRUE(folded.ok()) << folded.error().message;
  EXPECT_EQ(folded.value().norm_max_rows, 2);
  EXPECT_TRUE(folded.value().gated);
  EXPECT_EQ(folded.value().unit_k, 256);
  auto one = parse_skinny_choice("1-1,wmax=1");
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_EQ(one.value().min_rows, 1);
  EXPECT_EQ(one.value().max_rows, 1);
  EXPECT_EQ(one.value().max_weight_bytes, int64_t{1} << 20);
}

TEST(SkinnyChoice, RefusesWhatItDoesNotKnowByName) {
  for (const char* value : {"",
                            "17",
                            "-1",
                            "x",
                            "16,",
                            "16,plain,plain",
                            "16,stream",
                            "16 ",
                            ",plain",
                            "16,registers,registers",
                            "99999999999999999999",
                            "16,k256,k256",
                            "16,k256,registers",
                            "16,gated,registers",
                            "16,gated,gated",
                            "16,norm=0",
                            "16,norm=17",
                            "16,norm=",
                            "16,norm=x",
                            "16,norm=1,norm=1",
                            "16,registers,norm=1",
                            "16,k128",
                            "9-8",
                            "0-16",
                            "17-16",
                            "-16",
                            "9-",
                            "16,wmax=0",
                            "16,wmax=",
                            "16,wmax=x",
                            "16,wmax=64,wmax=64",
                            "16,wmax=9999999999"}) {
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

TEST(DecodeSplitsMax, UnsetIsNoCapAndBadValuesAreNamed) {
  EXPECT_EQ(parse_decode_splits_max(nullptr).value(), 256);
  EXPECT_EQ(parse_decode_splits_max("").value(), 256) << "empty is unset";
  EXPECT_EQ(parse_decode_splits_max("1").value(), 1);
  EXPECT_EQ(parse_decode_splits_max("16").value(), 16);
  EXPECT_EQ(parse_decode_splits_max("256").value(), 256);
  for (const char* bad : {"0", "257", "-1", "8x", " 8", "eight", "99999999999", "1e2"}) {
    auto got = parse_decode_splits_max(bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, KernelErrorCode::kBadArgument);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_DECODE_SPLITS_MAX=\"") + bad +
                                       "\": expected an integer in [1, 256]"),
              std::string::npos)
        << got.error().message;
  }
}

TEST(DecodeGraphPieces, EnvironmentOverridesTheOptionAndBadValuesAreNamed) {
  CudaDeviceOptions one;
  one.decode_graph_pieces = 1;
  CudaDeviceOptions three;
  three.decode_graph_pieces = 3;
  EXPECT_EQ(resolve_decode_graph_pieces(one, nullptr).value(), 1);
  EXPECT_EQ(resolve_decode_graph_pieces(three, nullptr).value(), 3);
  EXPECT_EQ(resolve_decode_graph_pieces(three, "").value(), 3) << "empty is unset";
  EXPECT_EQ(resolve_decode_graph_pieces(three, "1").value(), 1);
  EXPECT_EQ(resolve_decode_graph_pieces(one, "8").value(), 8);
  for (const char* bad : {"0", "9", "-1", "4x", " 4", "four", "99999999999"}) {
    auto got = resolve_decode_graph_pieces(one, bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_DECODE_GRAPH_PIECES=") + bad +
                                       ": expected an integer in [1, 8]"),
              std::string::npos)
        << got.error().message;
  }
  for (int32_t bad_option : {0, 9, -3}) {
    CudaDeviceOptions o;
    o.decode_graph_pieces = bad_option;
    auto got = resolve_decode_graph_pieces(o, nullptr);
    ASSERT_FALSE(got.ok()) << "accepted the option " << bad_option;
    EXPECT_NE(got.error().message.find("decode_graph_pieces " + std::to_string(bad_option)),
              std::string::npos)
        << got.error().message;
  }
}

TEST(GatedGemmMinRows, EnvironmentOverridesTheOptionAndBadValuesAreNamed) {
  CudaDeviceOptions o;
  o.gated_gemm_min_rows = 512;
  EXPECT_EQ(resolve_gated_gemm_min_rows(o, nullptr).value(), 512);
  EXPECT_EQ(resolve_gated_gemm_min_rows(o, "").value(), 512) << "empty is unset";
  EXPECT_EQ(resolve_gated_gemm_min_rows(o, "0").value(), 0) << "0 turns it off";
  EXPECT_EQ(resolve_gated_gemm_min_rows(o, "1").value(), 1);
  EXPECT_EQ(resolve_gated_gemm_min_rows(o, "1073741824").value(), 1073741824);
  for (const char* bad : {"-1", "1073741825", "256 ", "x", "2k", "99999999999"}) {
    auto got = resolve_gated_gemm_min_rows(o, bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_GATED_GEMM=") + bad +
                                       ": expected an integer in [0, 1073741824]"),
              std::string::npos)
        << got.error().message;
  }
  o.gated_gemm_min_rows = -5;
  auto got = resolve_gated_gemm_min_rows(o, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message.find("gated_gemm_min_rows -5"), std::string::npos)
      << got.error().message;
}

TEST(GatedGemmPairs, EnvironmentOverridesBothOptionsAndBadValuesAreNamed) {
  CudaDeviceOptions o;
  o.gated_gemm_pair_min_rows = 2048;
  o.gated_gemm_pair_epilogue = GatedPairEpilogue::kTensorStores;
  auto same = resolve_gated_gemm_pairs(o, nullptr, "");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same.value().gated_gemm_pair_min_rows, 2048) << "unset keeps the option";
  EXPECT_EQ(same.value().gated_gemm_pair_epilogue, GatedPairEpilogue::kTensorStores)
      << "empty is unset";
  auto set = resolve_gated_gemm_pairs(o, "512", "registers");
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set.value().gated_gemm_pair_min_rows, 512);
  EXPECT_EQ(set.value().gated_gemm_pair_epilogue, GatedPairEpilogue::kRegisters);
  EXPECT_EQ(resolve_gated_gemm_pairs(o, nullptr, "staged").value().gated_gemm_pair_epilogue,
            GatedPairEpilogue::kStaged);
  EXPECT_EQ(resolve_gated_gemm_pairs(o, nullptr, "tma").value().gated_gemm_pair_epilogue,
            GatedPairEpilogue::kTensorStores);
  EXPECT_EQ(resolve_gated_gemm_pairs(o, nullptr, "staged4").value().gated_gemm_pair_epilogue,
            GatedPairEpilogue::kStagedQuad);
  EXPECT_EQ(set.value().gated_gemm_min_rows, o.gated_gemm_min_rows) << "other options untouched";
  auto rows = resolve_gated_gemm_pairs(o, "-3", "1");
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.error().code, engine::DeviceErrorCode::kBadLayout);
  EXPECT_NE(rows.error().message.find("TWINSTEP_GATED_GEMM_PAIRS=-3: expected an integer in [0, "
                                      "1073741824]"),
            std::string::npos)
      << rows.error().message;
  auto epi = resolve_gated_gemm_pairs(o, "512", "TMA");
  ASSERT_FALSE(epi.ok());
  EXPECT_EQ(epi.error().code, engine::DeviceErrorCode::kBadLayout);
  EXPECT_NE(epi.error().message.find(
                "TWINSTEP_GATED_GEMM_EPILOGUE=TMA: expected registers, staged, tma or staged4"),
            std::string::npos)
      << epi.error().message;
  o.gated_gemm_pair_min_rows = -1;
  auto bad_option = resolve_gated_gemm_pairs(o, nullptr, nullptr);
  ASSERT_FALSE(bad_option.ok());
  EXPECT_NE(bad_option.error().message.find("gated_gemm_pair_min_rows -1"), std::string::npos)
      << bad_option.error().message;
}

TEST(QkvGemmFused, EnvironmentOverridesTheOptionAndBadValuesAreNamed) {
  CudaDeviceOptions o;
  EXPECT_EQ(o.qkv_gemm_fused_min_rows, 0) << "off unless asked for";
  o.qkv_gemm_fused_min_rows = 4096;
  EXPECT_EQ(resolve_qkv_gemm_fused_min_rows(o, nullptr).value(), 4096) << "unset keeps it";
  EXPECT_EQ(resolve_qkv_gemm_fused_min_rows(o, "").value(), 4096) << "empty is unset";
  EXPECT_EQ(resolve_qkv_gemm_fused_min_rows(o, "512").value(), 512);
  EXPECT_EQ(resolve_qkv_gemm_fused_min_rows(o, "0").value(), 0);
  for (const char* bad : {"-1", "1073741825", "512 ", "x", "5e2"}) {
    auto got = resolve_qkv_gemm_fused_min_rows(o, bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_QKV_GEMM_FUSED=") + bad),
              std::string::npos)
        << got.error().message;
  }
}

// The fused q|k|v GEMM's refusals, before any launch: each names what is wrong.
TEST(QkvGemmFused, RefusesWhatItDoesNotTakeByName) {
  alignas(16) static bf16 buf[64];
  alignas(16) static int32_t ints[8];
  alignas(16) static int64_t slots[8];
  QkvGemmArgs a;
  a.q = buf;
  a.q_norm = buf;
  a.q_heads = 16;
  a.q_row_stride = (16 + 2 * 8) * 256;
  a.pool.data = buf;
  a.pool.head_dim = 256;
  a.pool.kv_heads = 8;
  a.pool.layers = 2;
  a.pool.page_size = 16;
  a.pool.pages_total = 4;
  a.layer = 1;
  a.rows.rows = 8;
  a.rows.positions = ints;
  a.paging.row_slot = slots;
  EXPECT_EQ(qkv_gemm_refusal(8, 3840, a), "");
  QkvGemmArgs b = a;
  b.pool.head_dim = 512;
  EXPECT_NE(qkv_gemm_refusal(8, 3840, b).find("head_dim must be 256, got 512"), std::string::npos);
  b = a;
  b.rows.rows = 7;
  EXPECT_NE(qkv_gemm_refusal(8, 3840, b).find("must cover the 8 rows"), std::string::npos);
  b = a;
  b.q_row_stride = (16 + 2 * 8) * 256 - 8;
  EXPECT_NE(qkv_gemm_refusal(8, 3840, b).find("q_row_stride 8184 must cover q|k|v"),
            std::string::npos);
  b = a;
  b.layer = 2;
  EXPECT_NE(qkv_gemm_refusal(8, 3840, b).find("layer outside the pool"), std::string::npos);
  b = a;
  b.q_norm = nullptr;
  EXPECT_NE(qkv_gemm_refusal(8, 3840, b).find("q_norm"), std::string::npos);
  EXPECT_NE(qkv_gemm_refusal(8, 12, a).find("k must be a positive multiple of 8, got 12"),
            std::string::npos);
  auto s = qkv_gemm_norm_rope_write(buf, buf, 8, 3840, b, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("qkv_gemm_norm_rope_write: q, q_norm"), std::string::npos)
      << s.error().message;
  EXPECT_NE(plain_gemm_pairs(buf, buf, buf, 8, 128, 64, nullptr)
                .error()
                .message.find("n must be a positive multiple of 256, got 128"),
            std::string::npos);
}

// The gated GEMM's shape rules, checked before any launch (no GPU needed).
TEST(GatedGemm, RefusesShapesItDoesNotTakeByName) {
  EXPECT_EQ(gated_gemm_refusal(8192, 15360, 3840), "");
  EXPECT_EQ(gated_gemm_refusal(0, 128, 8), "") << "zero rows is a no-op, not an error";
  EXPECT_EQ(gated_gemm_refusal(3, 256, 200), "") << "k need not be a multiple of 64";
  EXPECT_NE(gated_gemm_refusal(-1, 128, 64).find("rows must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(
      gated_gemm_refusal(8, 100, 64).find("inter must be a positive multiple of 128, got 100"),
      std::string::npos);
  EXPECT_NE(gated_gemm_refusal(8, 0, 64).find("inter must be"), std::string::npos);
  EXPECT_NE(gated_gemm_refusal(8, 128, 12).find("k must be a positive multiple of 8, got 12"),
            std::string::npos);
  // Launch-side checks that come before any CUDA call: the refusal, then the alignment.
  alignas(16) static bf16 buf[64];
  auto s = gated_gelu_gemm(buf, buf, buf, 8, 100, 64, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("gated_gelu_gemm: inter must be"), std::string::npos)
      << s.error().message;
  s = gated_gelu_gemm(buf + 1, buf, buf, 8, 128, 64, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("16-byte aligned"), std::string::npos) << s.error().message;
}

TEST(GemmMemsetPenalty, EnvironmentOverridesTheOptionAndBadValuesAreNamed) {
  CudaDeviceOptions o;
  o.gemm_memset_penalty_us = 2.5;
  EXPECT_EQ(resolve_gemm_memset_penalty(o, nullptr).value(), 2.5);
  EXPECT_EQ(resolve_gemm_memset_penalty(o, "").value(), 2.5) << "empty is unset";
  EXPECT_EQ(resolve_gemm_memset_penalty(o, "4").value(), 4.0);
  EXPECT_EQ(resolve_gemm_memset_penalty(o, "0").value(), 0.0);
  EXPECT_EQ(resolve_gemm_memset_penalty(o, "3.75").value(), 3.75);
  for (const char* bad : {"-1", "101", "4us", " 4", "nan", "inf", "x"}) {
    auto got = resolve_gemm_memset_penalty(o, bad);
    ASSERT_FALSE(got.ok()) << "accepted \"" << bad << "\"";
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_GEMM_MEMSET_PENALTY=") + bad +
                                       ": expected microseconds in [0, 100]"),
              std::string::npos)
        << got.error().message;
  }
  o.gemm_memset_penalty_us = -2;
  EXPECT_FALSE(resolve_gemm_memset_penalty(o, nullptr).ok());
}

TEST(DecodeGraphCuts, GeometricFromLayerOneAndNeverAtOrPastTheLastLayer) {
  using V = std::vector<int32_t>;
  EXPECT_EQ(decode_graph_cuts(1, 48), V{});
  EXPECT_EQ(decode_graph_cuts(0, 48), V{});
  EXPECT_EQ(decode_graph_cuts(2, 48), V{1});
  EXPECT_EQ(decode_graph_cuts(4, 48), (V{1, 4, 16}));
  EXPECT_EQ(decode_graph_cuts(8, 48), (V{1, 4, 16}));  // 64 is past the 12B's 48 layers
  EXPECT_EQ(decode_graph_cuts(4, 8), (V{1, 4}));       // the gates' 8-layer cut
  EXPECT_EQ(decode_graph_cuts(4, 4), V{1});            // 4 is no layer of a 4-layer model
  EXPECT_EQ(decode_graph_cuts(4, 1), V{});
  EXPECT_EQ(decode_graph_cuts(8, 1000), (V{1, 4, 16, 64, 256}));
}

TEST(PrefillVariant512, EnvironmentOverridesTheOptionAndBadValuesAreNamed) {
  CudaDeviceOptions o;
  EXPECT_EQ(resolve_prefill_variant_512(o, nullptr).value(), PrefillVariant::kDefault);
  o.prefill_variant_512 = PrefillVariant::kWgmmaSplitDimsClusterKeyTile48;
  EXPECT_EQ(resolve_prefill_variant_512(o, nullptr).value(),
            PrefillVariant::kWgmmaSplitDimsClusterKeyTile48)
      << "unset keeps it";
  EXPECT_EQ(resolve_prefill_variant_512(o, "").value(),
            PrefillVariant::kWgmmaSplitDimsClusterKeyTile48)
      << "empty is unset";
  EXPECT_EQ(resolve_prefill_variant_512(o, "split").value(), PrefillVariant::kWgmmaSplitDims);
  EXPECT_EQ(resolve_prefill_variant_512(o, "cluster64").value(),
            PrefillVariant::kWgmmaSplitDimsClusterKeyTile64);
  EXPECT_EQ(resolve_prefill_variant_512(o, "default").value(), PrefillVariant::kDefault);
  for (const char* bad : {"Split", "cluster64 ", "cluster", "mma", "1"}) {
    auto got = resolve_prefill_variant_512(o, bad);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.error().code, engine::DeviceErrorCode::kBadLayout);
    EXPECT_NE(got.error().message.find(std::string("TWINSTEP_PREFILL_512=") + bad +
                                       ": expected default, split, cluster48 or cluster64"),
              std::string::npos)
        << got.error().message;
  }
  o.prefill_variant_512 = PrefillVariant::kMma;  // not a head_dim 512 choice of the option
  auto got = resolve_prefill_variant_512(o, nullptr);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message.find("prefill_variant_512"), std::string::npos)
      << got.error().message;
}

}  // namespace
}  // namespace twinstep::kernels
