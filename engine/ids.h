// Strong id types: request ids, pool tags and page ids bound to the pool that issued them.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <ostream>

namespace twinstep::engine {

struct RequestId {
  uint64_t value = 0;
  auto operator<=>(const RequestId&) const = default;
};
inline std::ostream& operator<<(std::ostream& os, RequestId id) { return os << "req#" << id.value; }

// Two KV families: sliding-window ("local") layers and full-attention ("global") layers.
enum class Family : uint8_t { kGlobal = 0, kLocal = 1 };
inline constexpr int kFamilyCount = 2;
inline constexpr Family kFamilies[kFamilyCount] = {Family::kGlobal, Family::kLocal};
inline const char* family_name(Family family) {
  return family == Family::kGlobal ? "global" : "local";
}

// Identity of one pool instance. Unique per process (a counter), so a page id from another
// engine's pool of the same family is caught too.
struct PoolTag {
  uint32_t value = 0;
  auto operator<=>(const PoolTag&) const = default;
};

// A page id is only meaningful to the pool that issued it.
struct PageId {
  PoolTag pool;
  uint32_t index = 0;  // 0 is the pool's reserved padding page; never handed out
  auto operator<=>(const PageId&) const = default;
};
inline std::ostream& operator<<(std::ostream& os, PageId id) {
  return os << "page(" << id.pool.value << ":" << id.index << ")";
}

}  // namespace twinstep::engine

template <>
struct std::hash<twinstep::engine::RequestId> {
  size_t operator()(twinstep::engine::RequestId id) const noexcept {
    return std::hash<uint64_t>()(id.value);
  }
};
