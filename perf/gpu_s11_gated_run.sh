#!/usr/bin/env bash
# perf/gpu_s11_gated_run.sh (session 11, issue 12): the gated gate|up GEMM. Builds its gates,
# the GEMM bench and the engine bench; runs the kernel gates, the GEMM A/B (--gated), ptxas'
# register report of the kernel, the engine's prefill with the gated GEMM off and on (one
# process an arm, twice), then the model gates that compare the two paths. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates gated_gemm_gates skinny_gemm_bench engine_throughput_bench model_gates
t built
BIN=build/gpu-gates/bin
cuobjdump -res-usage build/gpu-gates/kernels/libtwinstep_kernels.a 2>/dev/null |
  grep -A1 gated_gemm | grep -E "REG|STACK" | head -2
part gates "${LIMIT_GATES:-120}" "$BIN/gated_gemm_gates"
SUMMARY_CUT=300 summary "$OUT/gates.log"
part gemm 120 "$BIN/skinny_gemm_bench" --gated
cat "$OUT/gemm.log" | tail -24
for arm in 0 256 0 256; do
  TWINSTEP_GATED_GEMM=$arm part "prefill_$arm" 120 "$BIN/engine_throughput_bench" --prefill
  cat "$OUT/prefill_$arm.log" >> "$OUT/prefill_all.log"
  grep -E "gated gate|prefill 16x2048|GEMM|gelu|norms|attention|q/k" "$OUT/prefill_$arm.log" | head -14
done
rm -f "$OUT"/prefill_0.log "$OUT"/prefill_256.log
part model "${LIMIT_MODEL:-200}" "$BIN/model_gates" \
  --gtest_filter='ModelGates.GatedGemm*:ModelGates.CudnnLocalPrefill*:ModelGates.GreedyMatchesHfGenerate'
SUMMARY_CUT=300 summary "$OUT/model.log"
t done
