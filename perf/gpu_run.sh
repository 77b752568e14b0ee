#!/usr/bin/env bash
# perf/gpu_run.sh: one device call: the whole gpu-gates workflow (configure, build, every gate
# serially), then the bandwidth bench. Logs under $OUT; a short table last.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
cmake --preset gpu-gates > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build --preset gpu-gates -j16 > "$OUT/build.log" 2>&1 ||
  { grep -m 30 -E "error" "$OUT/build.log"; exit 1; }
ctest --preset gpu-gates ${GATES_REGEX:+-R "$GATES_REGEX"} > "$OUT/ctest.log" 2>&1
rc=$?
grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|\[gate\]" "$OUT/ctest.log"
echo "== bench"
timeout 120 ./build/gpu-gates/bin/kernel_bandwidth_bench 2>&1 | tee "$OUT/bench.log"
exit $rc
