// Named fault sites, in production code, fired by a seeded plan (FoundationDB BUGGIFY style).
// The engine consults kAllocGlobal/kAllocLocal when reserving pages; devices consult the rest.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/ids.h"

namespace twinstep::engine {

enum class FaultSite : uint8_t {
  kAllocGlobal = 0,  // engine: global pool refuses a reservation
  kAllocLocal,       // engine: local pool refuses a reservation
  kUpload,           // device: plan upload fails (before any KV write)
  kLaunch,           // device: kernel launch fails (before any KV write)
  kAfterKvWrite,     // device: fails after the step's KV writes landed
  kSync,             // device: the final synchronisation fails (after everything ran)
  kCount,
};
inline constexpr int kFaultSiteCount = static_cast<int>(FaultSite::kCount);

inline std::string_view fault_site_name(FaultSite site) {
  switch (site) {
    case FaultSite::kAllocGlobal:
      return "alloc_global";
    case FaultSite::kAllocLocal:
      return "alloc_local";
    case FaultSite::kUpload:
      return "upload";
    case FaultSite::kLaunch:
      return "launch";
    case FaultSite::kAfterKvWrite:
      return "after_kv_write";
    case FaultSite::kSync:
      return "sync";
    case FaultSite::kCount:
      break;
  }
  return "?";
}

// Decides whether a site fires. Implementations are seeded and deterministic. `request` names
// the request an allocation is for (engine sites); device sites pass no request.
class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  virtual bool fire(FaultSite site, RequestId request = RequestId{}) = 0;
};

}  // namespace twinstep::engine
