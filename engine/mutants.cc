// Mutant names and the process-wide selection.
#include "engine/mutants.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace twinstep::engine {
namespace {

constexpr std::string_view kNames[] = {
    "none",
    "skip_rollback_granted",
    "frontier_before_device",
    "leak_on_abort",
    "early_window_release",
    "commit_one_family",
    "token_after_terminal",
    "over_max_running",
    "decode_rows_uncharged",
    "failure_limit_early",
    "metrics_wrong_pool",
    "local_span_keeps_page",
    "ledger_second_terminal",
    "token_after_abort",
    "rollback_keeps_phase",
    "stop_ignored_on_first",
    "digest_keeps_overwritten",
    "ref_dropped_twice",
    "evict_referenced",
    "hit_from_one_family",
    "hash_without_chain",
    "partial_page_shared",
    "cached_on_free_list",
    "local_hit_ignores_window",
    "abort_count_not_bumped",
    "memo_misses_evict",
};
static_assert(std::size(kNames) == static_cast<size_t>(Mutant::kCount));

Mutant initial_mutant() {
  const char* env = std::getenv("TWINSTEP_MUTANT");
  if (env == nullptr || *env == '\0') return Mutant::kNone;
  auto mutant = mutant_from_name(env);
  if (!mutant) {
    std::fprintf(stderr, "TWINSTEP_MUTANT='%s' names no mutant\n", env);
    std::abort();
  }
  return *mutant;
}

}  // namespace

std::atomic<int> detail::g_active_mutant{static_cast<int>(initial_mutant())};

std::string_view mutant_name(Mutant mutant) { return kNames[static_cast<int>(mutant)]; }

std::optional<Mutant> mutant_from_name(std::string_view name) {
  for (int i = 0; i < static_cast<int>(Mutant::kCount); ++i) {
    if (kNames[i] == name) return static_cast<Mutant>(i);
  }
  return std::nullopt;
}

std::vector<Mutant> all_mutants() {
  std::vector<Mutant> out;
  for (int i = 1; i < static_cast<int>(Mutant::kCount); ++i) out.push_back(static_cast<Mutant>(i));
  return out;
}

bool mutants_compiled() {
#ifdef TWINSTEP_MUTANTS
  return true;
#else
  return false;
#endif
}

void set_active_mutant(Mutant mutant) { detail::g_active_mutant.store(static_cast<int>(mutant)); }

}  // namespace twinstep::engine
