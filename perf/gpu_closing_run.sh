#!/usr/bin/env bash
# perf/gpu_closing_run.sh: a session's closing device call when the kernels changed since the
# committed calibration: build everything once, refit the simulator's clock on the binaries
# just built (perf/gpu_calibration_run.sh with BIN set, so it builds nothing), then run every
# other gate with that fresh calibration (TWINSTEP_COST_MODEL; SimReplayGate itself ran inside
# the calibration script, on the same binary and file). Logs under $OUT, at most 8 files:
#   gpu.txt  build.log  run.log (calibration: sweep, fit, replay gate, check)
#   h200_gemma4_12b_{records,cost,replay}.json (to commit under perf/)  ctest.log
# TWINSTEP_GIT_REV: the commit the tree was copied from (the runner's copy has no .git).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv |
  tee "$OUT/gpu.txt"
start=$(date +%s)
{ cmake --preset gpu-gates && cmake --build --preset gpu-gates -j16; } > "$OUT/build.log" 2>&1 ||
  { grep -m 30 -E "error|Error" "$OUT/build.log"; exit 1; }
echo "build: $(($(date +%s) - start)) s"
BIN=build/gpu-gates/bin bash perf/gpu_calibration_run.sh
cal=$?
echo "calibration script: exit $cal, $(($(date +%s) - start)) s"
export TWINSTEP_COST_MODEL="$OUT/h200_gemma4_12b_cost.json"
timeout "${CTEST_TIMEOUT:-420}" ctest --preset gpu-gates -E "^SimReplayGate\." > "$OUT/ctest.log" 2>&1
rc=$?
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run" "$OUT/ctest.log"
echo "ctest: exit $rc, $(($(date +%s) - start)) s"
[ "$cal" -eq 0 ] && [ "$rc" -eq 0 ]
