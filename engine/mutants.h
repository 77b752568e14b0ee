// Named mutation switches, compiled in only with TWINSTEP_MUTANTS (the sim preset; never a
// release build) and chosen at run time. Each one plants a classic serving bug so the
// properties and the campaign can prove they catch it.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace twinstep::engine {

enum class Mutant : int {
  kNone = 0,
  kSkipRollbackGranted,     // admission: a refused family does not roll back the granted one
  kFrontierBeforeDevice,    // the frontier advances before the device runs
  kLeakOnAbort,             // abort forgets to free the request's pages
  kEarlyWindowRelease,      // a local page is released one step before the window leaves it
  kCommitOneFamily,         // commit takes the global pages but drops the local reservation
  kTokenAfterTerminal,      // a finished request gets one more token update
  kOverMaxRunning,          // admission lets one request more than max_running run
  kDecodeRowsUncharged,     // decode rows are not charged to the step's token budget
  kFailureLimitEarly,       // a request is failed one consecutive failure before the limit
  kMetricsWrongPool,        // metrics() reports the global pool's usage for the local family
  kLocalSpanKeepsPage,      // the shared local-span helper keeps one page behind the window
  kLedgerSecondTerminal,    // the engine's ledger accepts an update after a terminal
  kTokenAfterAbort,         // a decoding request aborted between steps decodes once more
  kRollbackKeepsPhase,      // a rolled-back admission goes back to waiting in the prefill phase
  kStopIgnoredOnFirst,      // a stop id is not honoured on a request's first generated token
  kDigestKeepsOverwritten,  // sim: a page digest keeps the term of the record a write replaced
  // Prefix cache (DESIGN.md §2.7):
  kRefDroppedTwice,        // abort drops its reference to a shared page twice
  kEvictReferenced,        // a published page joins the eviction order while it has holders
  kHitFromOneFamily,       // the hit length is the global family's; local pages missing from
                           // the window are skipped
  kHashWithoutChain,       // a page's hash covers its own tokens, not the prefix before them
  kPartialPageShared,      // the partly written last page is published too
  kCachedOnFreeList,       // a released published page goes to the free list, still published
  kLocalHitIgnoresWindow,  // a local hit needs every page before it, not just the window's
  // The abort count (Scheduler::retire_aborted looks for set flags only when it moved):
  kAbortCountNotBumped,  // RequestControl::abort sets the flag but does not bump the count
  kMemoMissesEvict,      // an evicted page's key does not move the pool's watch generation, so
                         // take_hit's memo can serve a hit whose pages left the cache
  kCount,
};

std::string_view mutant_name(Mutant mutant);
std::optional<Mutant> mutant_from_name(std::string_view name);
std::vector<Mutant> all_mutants();  // excluding kNone

// Whether the build has mutation switches at all.
bool mutants_compiled();
// Selects the active mutant (kNone to disable). Process-wide; tests set it before building an
// engine. The environment variable TWINSTEP_MUTANT=<name> selects one at start-up.
void set_active_mutant(Mutant mutant);
namespace detail {
// The selection, read inline: TS_MUTANT sits in per-row and per-page loops (a call and a
// function-local static's guard there cost ~1.5% of a campaign's instructions). Set from
// TWINSTEP_MUTANT during static initialisation; kNone before.
extern std::atomic<int> g_active_mutant;
}  // namespace detail
inline Mutant active_mutant() {
  return static_cast<Mutant>(detail::g_active_mutant.load(std::memory_order_relaxed));
}

}  // namespace twinstep::engine

#ifdef TWINSTEP_MUTANTS
#define TS_MUTANT(name) (::twinstep::engine::active_mutant() == ::twinstep::engine::Mutant::name)
#else
#define TS_MUTANT(name) false
#endif
