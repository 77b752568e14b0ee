#!/usr/bin/env bash
# perf/gpu_s11_closing_run.sh (session 11, the closing call): the tree as committed, built once;
# every gate (ctest --preset gpu-gates), the GEMM A/B (--gated), the engine's prefill with the
# gated GEMM off and on (one process an arm), the engine bench (quick), its decode sections with
# the long-context case, and the decode kernel bench. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-420}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
part gemm 60 "$BIN/skinny_gemm_bench" --gated
head -16 "$OUT/gemm.log" | tail -14
for arm in 0 129; do
  TWINSTEP_GATED_GEMM=$arm part "prefill_$arm" 60 "$BIN/engine_throughput_bench" --prefill
  grep -E "prefill 16x2048|gelu" "$OUT/prefill_$arm.log" | head -4
done
TWINSTEP_BENCH_QUICK=1 part bench "${LIMIT_BENCH:-80}" "$BIN/engine_throughput_bench"
grep -E "gated gate|decode graphs:|^\| |GEMM|gelu|attention|norms|q/k" "$OUT/bench.log" | head -30
part decode "${LIMIT_DECODE:-100}" "$BIN/engine_throughput_bench" --decode
grep -E "^\| |graphs: .* ms/step" "$OUT/decode.log"
part kbench 20 "$BIN/decode_attention_bench" --no-reference
grep -E "b=(1|16|64|128) .*1k" "$OUT/kbench.log" | head -8
t done
