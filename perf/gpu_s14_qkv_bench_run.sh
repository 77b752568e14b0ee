#!/usr/bin/env bash
# perf/gpu_s14_qkv_bench_run.sh (session 14, issue 12): where the fused q|k|v GEMM's time goes
# (skinny_gemm_bench --qkv: cuBLAS, the plain GEMM in pairs, the write, the engine's path, the
# fused kernel with and without rope and K/V). Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates skinny_gemm_bench
t built
part qkv 200 build/gpu-gates/bin/skinny_gemm_bench --qkv
cat "$OUT/qkv.log" | tail -12
t done
