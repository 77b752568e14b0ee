// Safetensors header validation: every malformed file is a clear error, never a crash.
#include "engine/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace twinstep::engine {
namespace {

// A file image: 8-byte little-endian header length, the header text, then `data_bytes` bytes.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes,
                           uint64_t header_len_override = UINT64_MAX) {
  const uint64_t len = header_len_override == UINT64_MAX ? header.size() : header_len_override;
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

SafetensorsError parse_error(const std::vector<uint8_t>& img) {
  auto r = SafetensorsFile::parse(img, "test.safetensors");
  EXPECT_FALSE(r.ok());
  return r.ok() ? SafetensorsError{} : r.error();
}

TEST(Safetensors, ParsesAValidHeader) {
  auto img = image(R"({"__metadata__":{"format":"pt"},)"
                   R"("b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},)"
                   R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                   20);
  auto r = SafetensorsFile::parse(img, "t");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].name, "a");  // sorted by name
  EXPECT_EQ((*r)[1].name, "b");
  EXPECT_EQ((*r)[1].dtype, DType::kBF16);
  EXPECT_EQ((*r)[1].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*r)[1].bytes.size(), 12u);
  EXPECT_EQ((*r)[1].bytes[0], 8);  // data bytes are their index
}

TEST(Safetensors, TruncatedBeforeTheLength) {
  std::vector<uint8_t> img = {1, 2, 3};
  auto e = parse_error(img);
  EXPECT_EQ(e.code, SafetensorsErrorCode::kTruncated);
  EXPECT_NE(e.message.find("shorter than the 8-byte header length"), std::string::npos)
      << e.message;
}

TEST(Safetensors, HeaderLengthPastTheEnd) {
  auto e = parse_error(image("{}", 0, 1000));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kTruncated);
  EXPECT_NE(e.message.find("runs past the end"), std::string::npos) << e.message;
}

TEST(Safetensors, AbsurdHeaderLengthIsRefusedBeforeAllocation) {
  auto e = parse_error(image("{}", 0, UINT64_MAX - 1));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kBadHeader);
  EXPECT_NE(e.message.find("exceeds"), std::string::npos) << e.message;
}

TEST(Safetensors, BadJson) {
  auto e = parse_error(image(R"({"a":{"dtype":"BF16",)", 0));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kBadHeader);
  EXPECT_NE(e.message.find("not valid JSON"), std::string::npos) << e.message;
}

TEST(Safetensors, HeaderNotAnObject) {
  auto e = parse_error(image("[1,2,3]", 0));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kBadHeader);
}

TEST(Safetensors, OffsetPastTheEnd) {
  auto e = parse_error(image(R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", 6));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kTruncated);
  EXPECT_NE(e.message.find("'w'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("past the data section"), std::string::npos) << e.message;
}

TEST(Safetensors, OverlappingTensors) {
  auto e = parse_error(image(R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[6,14]}})",
                             14));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kOverlap);
  EXPECT_NE(e.message.find("'a' and 'b' overlap"), std::string::npos) << e.message;
}

TEST(Safetensors, ShapeAndByteSizeDisagree) {
  auto e = parse_error(image(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kBadTensor);
  EXPECT_NE(e.message.find("needs 6 bytes but data_offsets span 8"), std::string::npos)
      << e.message;
}

TEST(Safetensors, UnknownDtype) {
  auto e = parse_error(image(R"({"w":{"dtype":"Q4","shape":[4],"data_offsets":[0,2]}})", 2));
  EXPECT_EQ(e.code, SafetensorsErrorCode::kBadTensor);
  EXPECT_NE(e.message.find("unknown dtype 'Q4'"), std::string::npos) << e.message;
}

TEST(Safetensors, MalformedEntries) {
  const char* bad[] = {
      R"({"w":{"dtype":"BF16","shape":[4]}})",                        // no offsets
      R"({"w":{"dtype":"BF16","shape":[-1],"data_offsets":[0,2]}})",  // negative dim
      R"({"w":{"dtype":"BF16","shape":"4","data_offsets":[0,8]}})",   // shape not array
      R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[8,0]}})",   // begin > end
      R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0]}})",     // one offset
      R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[-2,6]}})",  // negative offset
      R"({"w":7})",                                                   // not an object
      R"({"w":{"dtype":"BF16","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
  };
  for (const char* header : bad) {
    auto r = SafetensorsFile::parse(image(header, 8), "t");
    ASSERT_FALSE(r.ok()) << header;
    EXPECT_EQ(r.error().code, SafetensorsErrorCode::kBadTensor)
        << header << ": " << r.error().message;
  }
}

TEST(Safetensors, OpenMapsAWrittenFileAndReportsMissingFiles) {
  const auto dir = std::filesystem::temp_directory_path() / "twinstep_safetensors_test";
  std::filesystem::create_directories(dir);
  const std::vector<uint16_t> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {1.5f, -2.0f};
  ASSERT_TRUE(write_safetensors(
                  dir / "x.safetensors",
                  {{"a", DType::kBF16, {2, 3}, {reinterpret_cast<const uint8_t*>(a.data()), 12}},
                   {"b", DType::kF32, {2}, {reinterpret_cast<const uint8_t*>(b.data()), 8}}})
                  .ok());
  auto file = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_TRUE(file.ok()) << file.error().message;
  const TensorView* ta = file.value()->find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(std::memcmp(ta->bytes.data(), a.data(), 12), 0);
  EXPECT_EQ(file.value()->find("c"), nullptr);

  auto missing = SafetensorsFile::open(dir / "nope.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, SafetensorsErrorCode::kIo);
  EXPECT_NE(missing.error().message.find("nope.safetensors"), std::string::npos);

  // Truncate the file by one byte: the last tensor now runs past the end.
  std::filesystem::resize_file(dir / "x.safetensors",
                               std::filesystem::file_size(dir / "x.safetensors") - 1);
  auto cut = SafetensorsFile::open(dir / "x.safetensors");
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.error().code, SafetensorsErrorCode::kTruncated) << cut.error().message;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace twinstep::engine
