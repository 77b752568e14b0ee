#!/usr/bin/env bash
# perf/gpu_s14_qkv_run.sh (session 14, issue 12): the fused q|k|v GEMM (qkv_gemm_norm_rope_write):
# its kernel gate (GatedGemmGates.QkvGemm*, bitwise against plain_gemm_pairs then
# qk_norm_rope + kv_write, inline rope and rope table), its model gate (ModelGates.FusedQkvGemm*),
# the kernel bench (skinny_gemm_bench --qkv), then the engine's
# prefill step one process an arm and three rounds, off (cuBLAS then qkv_write) and fused from
# 512 rows (TWINSTEP_QKV_GEMM_FUSED=512): the step line and the qkv and q/k write phases.
# Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gated_gemm_gates model_gates engine_throughput_bench skinny_gemm_bench
t built
BIN=build/gpu-gates/bin
part gates 120 "$BIN/gated_gemm_gates"
SUMMARY_CUT=260 summary "$OUT/gates.log" | grep -E "gate\]|OK|FAIL|rror|xpected|Which|Value"
part model 300 "$BIN/model_gates" --gtest_filter='ModelGates.FusedQkv*'
SUMMARY_CUT=400 summary "$OUT/model.log" | grep -E "gate\]|OK|FAIL|rror|xpected|Which|Value"
t gates done
part qkv_bench 200 "$BIN/skinny_gemm_bench" --qkv
tail -9 "$OUT/qkv_bench.log"
n=0
for round in 1 2 3; do
  for arm in off fused; do
    n=$((n + 1))
    env_arm=(TWINSTEP_QKV_GEMM_FUSED=0)
    [ $arm = fused ] && env_arm=(TWINSTEP_QKV_GEMM_FUSED=512)
    part "prefill_${n}_$arm" 90 env "${env_arm[@]}" "$BIN/engine_throughput_bench" --prefill
    echo "$arm: $(grep -E "^\| prefill 16x2048" "$OUT/prefill_${n}_$arm.log" | cut -c1-60)"
    grep -E "qkv gemm|q/k norm" "$OUT/prefill_${n}_$arm.log" | head -2
  done
done
t done
