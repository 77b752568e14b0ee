#!/usr/bin/env bash
# perf/gpu_s13_gates_run.sh (session 13): the tree as committed, built once; every gate
# (ctest --preset gpu-gates), then the engine's prefill (default options) and the decode
# attention kernel bench. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-450}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
part prefill 60 "$BIN/engine_throughput_bench" --prefill
grep -E "gated gate|^\| prefill|gate_up gemm|launch" "$OUT/prefill.log" | head -5
t done
