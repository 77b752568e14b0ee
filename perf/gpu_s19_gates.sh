#!/usr/bin/env bash
# perf/gpu_s19_gates.sh (written in session 18 for the closing runs of issues 13 and 12 on the
# H200): the tree as committed, built once, every gate (ctest --preset gpu-gates, ~390 s).
# The benches follow in perf/gpu_s19_bench.sh, a second call on the same warm machine (the
# build outputs stay there between calls).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-500}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
grep -E "\[gate\] stream_gemm_gated|\[gate\] .*HF|calibration was fitted" "$OUT/ctest.log" | head -20
t done
cd "$OUT" && gzip -9 ctest.log
