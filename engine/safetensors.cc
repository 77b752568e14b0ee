// Safetensors parsing over a read-only mmap. The header is untrusted input: every field is
// checked before use (lengths against the file size first, then JSON, then each tensor), and
// the tensors' byte ranges must tile without overlap inside the data section.
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

namespace twinstep::engine {
namespace {

using nlohmann::json;

// Headers beyond this are refused before allocation (the format's reference limit).
constexpr uint64_t kHeaderBytesMax = uint64_t{100} << 20;

Unexpected<SafetensorsError> fail(SafetensorsErrorCode code, std::string message) {
  return unexpected(SafetensorsError{code, std::move(message)});
}

struct DTypeName {
  const char* name;
  DType dtype;
  int32_t bytes;
};
constexpr DTypeName kDTypes[] = {
    {"BF16", DType::kBF16, 2}, {"F16", DType::kF16, 2}, {"F32", DType::kF32, 4},
    {"F64", DType::kF64, 8},   {"I8", DType::kI8, 1},   {"U8", DType::kU8, 1},
    {"I16", DType::kI16, 2},   {"I32", DType::kI32, 4}, {"I64", DType::kI64, 8},
    {"BOOL", DType::kBool, 1},
};

Result<DType, SafetensorsError> parse_dtype(const json& j, const std::string& where) {
  if (!j.is_string())
    return fail(SafetensorsErrorCode::kBadTensor, where + ": dtype must be a string");
  const std::string s = j.get<std::string>();
  for (const DTypeName& d : kDTypes) {
    if (s == d.name) return d.dtype;
  }
  return fail(SafetensorsErrorCode::kBadTensor,
              where + ": unknown dtype '" + s + "' (expected BF16, F16, F32, ...)");
}

// Multiplies without overflow; false when the product leaves int64.
bool checked_mul(int64_t a, int64_t b, int64_t* out) {
  if (a != 0 && b > std::numeric_limits<int64_t>::max() / a) return false;
  *out = a * b;
  return true;
}

Result<TensorView, SafetensorsError> parse_entry(const std::string& name, const json& entry,
                                                 std::span<const uint8_t> data,
                                                 const std::string& label) {
  const std::string where = label + ": tensor '" + name + "'";
  if (!entry.is_object()) {
    return fail(SafetensorsErrorCode::kBadTensor, where + " must be an object");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return fail(SafetensorsErrorCode::kBadTensor, where + " lacks '" + field + "'");
    }
  }
  TensorView view;
  view.name = name;
  auto dtype = parse_dtype(entry["dtype"], where);
  if (!dtype) return unexpected(dtype.error());
  view.dtype = dtype.value();
  const json& shape = entry["shape"];
  if (!shape.is_array())
    return fail(SafetensorsErrorCode::kBadTensor, where + ": shape must be an array");
  int64_t elements = 1;
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return fail(SafetensorsErrorCode::kBadTensor,
                  where + ": shape entries must be non-negative integers, got " + shape.dump());
    }
    view.shape.push_back(d.get<int64_t>());
    if (!checked_mul(elements, d.get<int64_t>(), &elements)) {
      return fail(SafetensorsErrorCode::kBadTensor,
                  where + ": shape " + shape.dump() + " overflows");
    }
  }
  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    return fail(
        SafetensorsErrorCode::kBadTensor,
        where + ": data_offsets must be [begin, end] non-negative integers, got " + offsets.dump());
  }
  const uint64_t begin = offsets[0].get<uint64_t>();
  const uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) {
    return fail(
        SafetensorsErrorCode::kBadTensor,
        where + ": data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
  }
  if (end > data.size()) {
    return fail(SafetensorsErrorCode::kTruncated,
                where + ": data_offsets end " + std::to_string(end) +
                    " is past the data section (" + std::to_string(data.size()) + " bytes)");
  }
  int64_t bytes = 0;
  if (!checked_mul(elements, dtype_bytes(view.dtype), &bytes) ||
      static_cast<uint64_t>(bytes) != end - begin) {
    return fail(SafetensorsErrorCode::kBadTensor,
                where + ": shape " + shape.dump() + " of " + dtype_name(view.dtype) + " needs " +
                    std::to_string(bytes) + " bytes but data_offsets span " +
                    std::to_string(end - begin));
  }
  view.bytes = data.subspan(begin, end - begin);
  return view;
}

}  // namespace

const char* dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

int32_t dtype_bytes(DType dtype) {
  for (const DTypeName& d : kDTypes) {
    if (d.dtype == dtype) return d.bytes;
  }
  TS_UNREACHABLE() << static_cast<int>(dtype);
  return 0;
}

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Result<std::vector<TensorView>, SafetensorsError> SafetensorsFile::parse(
    std::span<const uint8_t> image, const std::string& label) {
  if (image.size() < 8) {
    return fail(SafetensorsErrorCode::kTruncated,
                label + ": " + std::to_string(image.size()) +
                    " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | image[i];
  if (header_bytes > kHeaderBytesMax) {
    return fail(SafetensorsErrorCode::kBadHeader,
                label + ": header length " + std::to_string(header_bytes) + " exceeds the " +
                    std::to_string(kHeaderBytesMax) + "-byte limit");
  }
  if (header_bytes > image.size() - 8) {
    return fail(SafetensorsErrorCode::kTruncated,
                label + ": header length " + std::to_string(header_bytes) +
                    " runs past the end of the file (" + std::to_string(image.size() - 8) +
                    " bytes after the length)");
  }
  const char* text = reinterpret_cast<const char*>(image.data() + 8);
  json header = json::parse(text, text + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return fail(SafetensorsErrorCode::kBadHeader, label + ": header is not valid JSON");
  }
  if (!header.is_object()) {
    return fail(SafetensorsErrorCode::kBadHeader,
                label + ": header must be a JSON object, got " + std::string(header.type_name()));
  }
  const std::span<const uint8_t> data = image.subspan(8 + header_bytes);
  std::vector<TensorView> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    auto view = parse_entry(it.key(), it.value(), data, label);
    if (!view) return unexpected(view.error());
    tensors.push_back(std::move(view.value()));
  }
  // Byte ranges must not overlap (empty tensors occupy nothing).
  std::vector<const TensorView*> by_offset;
  for (const TensorView& t : tensors) {
    if (!t.bytes.empty()) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorView* a, const TensorView* b) {
    return a->bytes.data() < b->bytes.data();
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorView* prev = by_offset[i - 1];
    const TensorView* cur = by_offset[i];
    if (prev->bytes.data() + prev->bytes.size() > cur->bytes.data()) {
      return fail(SafetensorsErrorCode::kOverlap, label + ": tensors '" + prev->name + "' and '" +
                                                      cur->name + "' overlap in the data section");
    }
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return tensors;
}

Result<std::unique_ptr<SafetensorsFile>, SafetensorsError> SafetensorsFile::open(
    const std::filesystem::path& path) {
  const std::string label = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return fail(SafetensorsErrorCode::kIo, label + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return fail(SafetensorsErrorCode::kIo, label + ": cannot stat: " + why);
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return fail(SafetensorsErrorCode::kIo, label + ": cannot mmap: " + why);
    }
    file->map_ = map;
    file->map_bytes_ = size;
  }
  ::close(fd);  // the mapping keeps the file alive
  std::span<const uint8_t> image(static_cast<const uint8_t*>(file->map_), file->map_bytes_);
  auto tensors = parse(image, label);
  if (!tensors) return unexpected(tensors.error());
  file->tensors_ = std::move(tensors.value());
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

Status<SafetensorsError> write_safetensors(const std::filesystem::path& path,
                                           const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  header["__metadata__"] = json{{"format", "pt"}};
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    header[t.name] = json{{"dtype", dtype_name(t.dtype)},
                          {"shape", t.shape},
                          {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // align the data section
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return fail(SafetensorsErrorCode::kIo, path.string() + ": cannot create");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const TensorToWrite& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
  }
  if (!out) return fail(SafetensorsErrorCode::kIo, path.string() + ": write failed");
  return Ok{};
}

}  // namespace twinstep::engine
