#!/usr/bin/env bash
# perf/gpu_s19_fold.sh (written in session 18 for the next session's first call, ~200 s): the
# residual norms folded into the o_proj and down GEMMs (stream_gemm_residual_norm, opt-in as
# TWINSTEP_SKINNY ",norm=R"): its two gates, then the decode A/B, one process an arm,
# alternating: the default (1-16, k256, gated; no fold) against the fold for 1, 4 and 16 rows.
# If an arm wins at b=1 and loses nowhere, kDefaultFewRowGemm gets that norm_max_rows and the
# closing runs (gpu_s19_gates.sh, gpu_s19_bench.sh) follow.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates engine_throughput_bench skinny_gemm_gates decode_graph_gates kernel_bandwidth_bench
t built
BIN=build/gpu-gates/bin
part fold_kernel 120 "$BIN/skinny_gemm_gates" --gtest_filter='StreamGemmGates.ResidualNorm*'
summary "$OUT/fold_kernel.log"
part fold_engine 120 "$BIN/decode_graph_gates" --gtest_filter='*FoldedResidualNorm*'
summary "$OUT/fold_engine.log"
decode_arms def_1: n1_1:1-16,k256,gated,norm=1 n4_1:1-16,k256,gated,norm=4 \
  n16_1:1-16,k256,gated,norm=16 def_2: n1_2:1-16,k256,gated,norm=1 \
  n4_2:1-16,k256,gated,norm=4 n16_2:1-16,k256,gated,norm=16
# The CUPTI kernel timeline of each decode batch on the defaults (session 18 had no machine for
# it): where the b=1 step's time outside the weight GEMMs goes, kernel by kernel.
TWINSTEP_BENCH_QUICK=1 TWINSTEP_BENCH_TRACE=1 part trace 100 "$BIN/engine_throughput_bench" --decode
awk '/^-- trace: decode b=1, graphs/{on=1} /^-- trace: decode b=1, eager/{on=0} on' \
  "$OUT/trace.log" | head -40
# Issue 12's measured-first question: the prefill q/k write kernels with and without the rope
# (how much a step's shared angle table could take off them).
TWINSTEP_BW_ONLY=qkv part qkv_bw 60 "$BIN/kernel_bandwidth_bench"
grep -E "copy|8192" "$OUT/qkv_bw.log" | head -30
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
