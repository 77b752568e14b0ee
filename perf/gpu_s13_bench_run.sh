#!/usr/bin/env bash
# perf/gpu_s13_bench_run.sh (session 13, the closing benches): the tree as committed; the
# engine bench (quick: prefill and decode with the phase tables), its decode sections with the
# long-context case, the prefill step with lone blocks against the default (pairs, staged) one
# process an arm, and the decode attention kernel bench. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates engine_throughput_bench decode_attention_bench
t built
BIN=build/gpu-gates/bin
TWINSTEP_BENCH_QUICK=1 part bench 100 "$BIN/engine_throughput_bench"
grep -E "gated gate|decode graphs:|^\| |gate_up|attention  |norms" "$OUT/bench.log" | head -30
part decode 120 "$BIN/engine_throughput_bench" --decode
grep -E "^\| |graphs: .* ms/step" "$OUT/decode.log"
for arm in lone default lone default; do
  env_arm=()
  [ $arm = lone ] && env_arm=(TWINSTEP_GATED_GEMM_PAIRS=0)
  part "prefill_$arm" 60 env "${env_arm[@]}" "$BIN/engine_throughput_bench" --prefill
  echo "$arm: $(grep -E "^\| prefill 16x2048" "$OUT/prefill_$arm.log" | cut -c1-70)"
done
part kbench 30 "$BIN/decode_attention_bench" --no-reference
grep -E "b=(1|16|64|128) .*1k|copy" "$OUT/kbench.log" | head -10
t done
