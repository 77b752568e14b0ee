// A read-only, memory-mapped safetensors file: header validation and tensor views.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {...}}, then the data section; offsets are
// relative to the data section. Every malformed header is a returned error, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/result.h"

namespace twinstep::engine {

enum class SafetensorsErrorCode {
  kIo,         // cannot open / stat / map the file
  kTruncated,  // shorter than its header says
  kBadHeader,  // header is not the expected JSON document
  kBadTensor,  // a tensor entry is inconsistent (dtype, shape, offsets)
  kOverlap,    // two tensors share bytes
};
using SafetensorsError = Error<SafetensorsErrorCode>;

enum class DType : uint8_t { kBF16, kF16, kF32, kF64, kI8, kU8, kI16, kI32, kI64, kBool };
const char* dtype_name(DType dtype);
int32_t dtype_bytes(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;  // inside the mapping; valid while the file lives
  int64_t elements() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates the header against the file size.
  static Result<std::unique_ptr<SafetensorsFile>, SafetensorsError> open(
      const std::filesystem::path& path);
  // Validates an in-memory image (the same checks; the buffer must outlive the views).
  static Result<std::vector<TensorView>, SafetensorsError> parse(std::span<const uint8_t> image,
                                                                 const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  std::vector<TensorView> tensors_;  // sorted by name
};

// Writes a safetensors file (tests and the random-weights builder). Tensors are laid out in
// the given order. Returns an error message on I/O failure.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};
Status<SafetensorsError> write_safetensors(const std::filesystem::path& path,
                                           const std::vector<TensorToWrite>& tensors);

}  // namespace twinstep::engine
