#!/usr/bin/env bash
# Runs the property binary once per mutant and fails unless every mutant is caught by at least
# one property. Prints each mutant with the properties that caught it.
set -u
bin="$1"
mutants=(skip_rollback_granted frontier_before_device leak_on_abort early_window_release
         commit_one_family token_after_terminal over_max_running decode_rows_uncharged
         failure_limit_early metrics_wrong_pool local_span_keeps_page ledger_second_terminal
         token_after_abort rollback_keeps_phase stop_ignored_on_first
         ref_dropped_twice evict_referenced hit_from_one_family hash_without_chain
         partial_page_shared cached_on_free_list local_hit_ignores_window
         abort_count_not_bumped memo_misses_evict)
# The un-mutated engine must pass, or a "caught" mutant would prove nothing.
if ! RC_PARAMS="max_success=200 noshrink=1" "$bin" >/dev/null 2>&1; then
  echo "FAIL: the properties fail without any mutant"
  exit 1
fi
missed=0
for m in "${mutants[@]}"; do
  out=$(TWINSTEP_MUTANT="$m" RC_PARAMS="max_success=2000 noshrink=1" "$bin" 2>&1)
  rc=$?
  caught=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \([A-Za-z]*\.[A-Za-z]*\) .*/\1/p' | sort -u | paste -sd, -)
  # A mutant that ends the process (an engine check aborting, a signal) before any property
  # reports is caught too: the un-mutated binary passed above.
  if [ -z "$caught" ] && [ "$rc" -ne 0 ]; then
    caught="the binary itself (exit $rc: $(printf '%s\n' "$out" | grep -m1 -E 'Check failed|TS_CHECK|Abort|terminate' || echo 'no report'))"
  fi
  if [ -n "$caught" ]; then
    printf 'mutant %-24s caught by: %s\n' "$m" "$caught"
  else
    printf 'mutant %-24s NOT CAUGHT\n' "$m"
    missed=$((missed + 1))
  fi
done
if [ "$missed" -ne 0 ]; then
  echo "FAIL: $missed mutant(s) survived"
  exit 1
fi
echo "all ${#mutants[@]} mutants caught"
