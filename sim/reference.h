// The reference model the harness checks the engine against, written from DESIGN.md §2.2 and
// §2.1 alone: which pages a request must hold at a frontier (from positions, page size and
// window), and what a failed step must leave unchanged. It calls no engine helper on purpose:
// engine/kv_state.h computes the page account for the engine, and a checker that called it
// would agree with any bug in it by construction.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/ids.h"
#include "engine/scheduler.h"

namespace twinstep::sim {

// Logical pages [first, first + count) of one family; `first` means nothing when count is 0.
struct ExpectedPages {
  int32_t first = 0;
  int32_t count = 0;
};

// Positions 0 .. frontier-1 are written. The global family holds every page with a written
// position. The local family holds those of them that the next token (position `frontier`)
// still sees: its window is positions frontier-window+1 .. frontier.
ExpectedPages expected_pages(engine::Family family, int32_t frontier, int32_t page_size,
                             int32_t window);

// Everything a failed step must not change (§2.2 "a retry is indistinguishable from a first
// try"): per request its frontier, tokens, pages and phase, and the order of both queues.
struct FailedStepSnapshot {
  std::map<engine::RequestId, uint64_t> digests;  // frontier, tokens, pages, phase
  std::vector<engine::RequestId> waiting;
  std::vector<engine::RequestId> running;
};
FailedStepSnapshot snapshot_for_failed_step(const engine::Scheduler& scheduler);

// What a failed step changed in the requests that outlived it (aborted, failed and newly
// arrived requests excluded); nullopt when nothing.
std::optional<std::string> moved_in_failed_step(const FailedStepSnapshot& before,
                                                const engine::Scheduler& after);

}  // namespace twinstep::sim
