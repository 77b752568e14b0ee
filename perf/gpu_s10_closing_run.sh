#!/usr/bin/env bash
# perf/gpu_s10_closing_run.sh (session 10, the closing call): the tree as committed, built once;
# every gate (ctest --preset gpu-gates, the committed calibration), then the engine bench
# (quick: prefill and decode), the decode sections with the long-context case (--decode), and
# the decode kernel bench. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-420}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
TWINSTEP_BENCH_QUICK=1 part bench "${LIMIT_BENCH:-80}" "$BIN/engine_throughput_bench"
grep -E "decode graphs:|^\| " "$OUT/bench.log"
part decode "${LIMIT_DECODE:-100}" "$BIN/engine_throughput_bench" --decode
grep -E "^\| |graphs: .* ms/step" "$OUT/decode.log"
part kbench 20 "$BIN/decode_attention_bench" --no-reference
t done
