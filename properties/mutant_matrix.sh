#!/usr/bin/env bash
# The mutant x suite matrix: every mutant twinstep-sim lists is run through three independent
# suites (the RapidCheck properties, the default campaign, the fuzz target's corpus replay plus
# seeded random inputs), each caught or not, and the test fails unless every mutant is caught
# by at least two of them. The unmutated suites must pass first, or "caught" proves nothing.
# Usage: mutant_matrix.sh PROPERTIES_BIN SIM_BIN FUZZ_REPLAY_BIN CORPUS_DIR [REPORT_FILE]
set -u
props="$1" sim="$2" fuzz="$3" corpus="$4" report="${5:-}"
mutants=$("$sim" --list-mutants) || { echo "FAIL: $sim --list-mutants (no TWINSTEP_MUTANTS?)"; exit 1; }

# Each suite: exit 0 when it passes; non-zero only when it caught something (a failed property,
# a campaign violation (exit 1, not a usage error or an unhit coverage mark), a fuzz report).
run_properties() {
  local out
  out=$(TWINSTEP_MUTANT="$1" RC_PARAMS="max_success=${2:-1000} noshrink=1" "$props" 2>&1) && return 0
  grep -q '^\[  FAILED  \]' <<<"$out" && return 1
  echo "properties under '$1' exited without a failed property" >&2 && exit 2
}
run_campaign() {
  "$sim" --no-progress ${1:+--mutant "$1"} --seeds "${2:-256}" >/dev/null 2>&1
  local rc=$?
  [ "$rc" -le 1 ] || { echo "campaign under '$1' exited $rc" >&2 && exit 2; }
  return "$rc"
}
run_fuzz() {
  local out
  out=$( (TWINSTEP_MUTANT="$1" "$fuzz" "$corpus" --random "${2:-3000}" 1) 2>&1) && return 0
  grep -qE 'twinstep-fuzz: |check failed: ' <<<"$out" && return 1
  echo "the fuzz replay under '$1' failed without a report" >&2 && exit 2
}

run_properties "" 200 || { echo "FAIL: the properties fail without any mutant"; exit 1; }
run_campaign "" 64 || { echo "FAIL: the campaign fails without any mutant"; exit 1; }
run_fuzz "" 300 || { echo "FAIL: the fuzz target fails without any mutant"; exit 1; }

table=$(printf '%-26s %-11s %-11s %-11s %s\n' mutant properties campaign fuzz caught-by)
weak=0
count=0
for m in $mutants; do
  count=$((count + 1))
  row=() n=0
  for suite in properties campaign fuzz; do
    if "run_$suite" "$m"; then row+=("-"); else row+=("CAUGHT"); n=$((n + 1)); fi
  done
  [ "$n" -ge 2 ] || weak=$((weak + 1))
  table+=$'\n'$(printf '%-26s %-11s %-11s %-11s %d/3' "$m" "${row[0]}" "${row[1]}" "${row[2]}" "$n")
done
printf '%s\n' "$table"
[ -n "$report" ] && printf '%s\n' "$table" >"$report"
if [ "$weak" -ne 0 ]; then
  echo "FAIL: $weak of $count mutant(s) caught by fewer than two suites"
  exit 1
fi
echo "all $count mutants caught by at least two of the three suites"
