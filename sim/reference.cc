// The reference model: the page account from first principles and the failed-step snapshot.
#include "sim/reference.h"

#include <algorithm>
#include <sstream>

#include "engine/check.h"
#include "sim/rng.h"

namespace twinstep::sim {

using engine::Family;

ExpectedPages expected_pages(Family family, int32_t frontier, int32_t page_size, int32_t window) {
  TS_CHECK(frontier >= 0 && page_size > 0 && window > 0)
      << "frontier=" << frontier << " page_size=" << page_size << " window=" << window;
  if (frontier == 0) return {};
  const int32_t last_written_page = (frontier - 1) / page_size;
  if (family == Family::kGlobal) return {0, last_written_page + 1};
  // The oldest position the next token attends to, and the page it lies in. Every page from
  // there to the last written one reaches into the window; every page before it lies wholly
  // behind it. With a window of one that page may be the next token's own, not yet written.
  const int32_t oldest_seen = std::max(0, frontier - (window - 1));
  const int32_t first = oldest_seen / page_size;
  if (first > last_written_page) return {first, 0};
  return {first, last_written_page - first + 1};
}

namespace {

uint64_t digest(const engine::RequestState& r) {
  uint64_t h = mix64((static_cast<uint64_t>(r.frontier) << 32) ^ r.tokens.size());
  h = mix64(h ^ (0x9a5e00 + static_cast<uint64_t>(r.phase.get())));
  if (!r.tokens.empty()) h = mix64(h ^ static_cast<uint32_t>(r.tokens.back()));
  for (const Family f : engine::kFamilies) {
    const engine::KvState& kv = r.kv_of(f);
    h = mix64(h ^ static_cast<uint32_t>(kv.first_page) ^ (uint64_t{kv.pages.size()} << 32));
    // A polynomial over the page list (odd multiplier: changing any one entry, or swapping two
    // different ones, changes it), mixed once: a failed step is checked on every step a fault
    // can fire, so this runs over every held page each time.
    uint64_t list = 0;
    for (const engine::PageId page : kv.pages) list = list * 0x9e3779b97f4a7c15ULL + page.index + 1;
    h = mix64(h ^ list);
  }
  return h;
}

// `ids` in their order, keeping only those in `keep`.
template <class Ids>
std::vector<engine::RequestId> survivors(const Ids& ids,
                                         const std::map<engine::RequestId, uint64_t>& keep) {
  std::vector<engine::RequestId> out;
  for (const engine::RequestId id : ids) {
    if (keep.count(id) != 0) out.push_back(id);
  }
  return out;
}

std::string show(const std::vector<engine::RequestId>& ids) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? " " : "") << ids[i];
  os << "]";
  return os.str();
}

}  // namespace

FailedStepSnapshot snapshot_for_failed_step(const engine::Scheduler& scheduler) {
  FailedStepSnapshot s;
  for (const auto& [id, r] : scheduler.requests()) s.digests.emplace(id, digest(r));
  s.waiting.assign(scheduler.waiting().begin(), scheduler.waiting().end());
  s.running = scheduler.running();
  return s;
}

std::optional<std::string> moved_in_failed_step(const FailedStepSnapshot& before,
                                                const engine::Scheduler& after) {
  std::map<engine::RequestId, uint64_t> outlived;
  for (const auto& [id, d] : before.digests) {
    auto it = after.requests().find(id);
    if (it == after.requests().end()) continue;
    if (digest(it->second) != d) {
      std::ostringstream os;
      os << id << " changed frontier, tokens, pages or phase in a failed step (frontier now "
         << it->second.frontier << ", phase " << request_phase_name(it->second.phase) << ")";
      return os.str();
    }
    outlived.emplace(id, d);
  }
  const auto waiting_before = survivors(before.waiting, outlived);
  const auto waiting_after = survivors(after.waiting(), outlived);
  const auto running_before = survivors(before.running, outlived);
  const auto running_after = survivors(after.running(), outlived);
  if (waiting_before != waiting_after || running_before != running_after) {
    return "a failed step changed the queues: waiting " + show(waiting_before) + " -> " +
           show(waiting_after) + ", running " + show(running_before) + " -> " + show(running_after);
  }
  return std::nullopt;
}

}  // namespace twinstep::sim
