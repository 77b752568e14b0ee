#!/usr/bin/env bash
# perf/gpu_s11_release_run.sh (session 11, issue 12): the gated GEMM's clusters of two with the
# stage release at CTA scope (was .release.cluster), made the default for this probe: its gates,
# the GEMM A/B (--gated: lone blocks vs clusters), the model gate that compares the engine with
# the two-kernel path, and the engine's prefill off / on. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gated_gemm_gates skinny_gemm_bench engine_throughput_bench model_gates
t built
BIN=build/gpu-gates/bin
part gates 60 "$BIN/gated_gemm_gates"
SUMMARY_CUT=200 summary "$OUT/gates.log" | grep -E "OK|FAIL|12B|windows"
part gemm 60 "$BIN/skinny_gemm_bench" --gated
head -16 "$OUT/gemm.log" | tail -14
for arm in 0 129 0 129; do
  TWINSTEP_GATED_GEMM=$arm part "prefill_$arm" 60 "$BIN/engine_throughput_bench" --prefill
  grep -E "prefill 16x2048|gate_up gemm|gelu" "$OUT/prefill_$arm.log" | head -4
done
part model 150 "$BIN/model_gates" --gtest_filter='ModelGates.GatedGemm*'
SUMMARY_CUT=250 summary "$OUT/model.log"
t done
