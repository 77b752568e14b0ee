#!/usr/bin/env bash
# perf/gpu_s11_profile_run.sh (session 11, issue 12): ncu of cuBLAS's gate|up GEMM and of the
# gated GEMM at 8192 rows (skinny_gemm_bench --gated-profile), clock control none. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates skinny_gemm_bench
t built
BIN=build/gpu-gates/bin
timeout 300 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__cycles_active.avg \
  "$BIN/skinny_gemm_bench" --gated-profile > "$OUT/ncu.log" 2>&1
echo "ncu: exit $?"
grep -E "gated_gemm|Kernel|sm90|Duration|Throughput|gmma|lts__t|xbar|Registers|Warp Cycles|Stall|Eligible|Issued|Active Warps|No Eligible|L2 Hit|Block Size|Grid Size|Waves|Shared Memory Config" "$OUT/ncu.log" | cut -c1-160 | head -90
t done
