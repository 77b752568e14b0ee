#!/usr/bin/env bash
# perf/gpu_s11_cluster_run.sh (session 11, issue 12): the gated GEMM in clusters of two blocks
# (multicast weight slices) against lone blocks: its gates, the GEMM A/B (--gated), ncu of
# cuBLAS's gate|up GEMM and both gated variants at 8192 rows, then the engine's prefill with the
# gated GEMM off and on, and its decode (section 2) with the gated GEMM from 256 and from 17 rows
# (one process an arm). Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gated_gemm_gates skinny_gemm_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 120 "$BIN/gated_gemm_gates"
SUMMARY_CUT=300 summary "$OUT/gates.log"
part gemm 120 "$BIN/skinny_gemm_bench" --gated
tail -22 "$OUT/gemm.log"
timeout 240 ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex.sum,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio \
  "$BIN/skinny_gemm_bench" --gated-profile > "$OUT/ncu.log" 2>&1
echo "ncu: exit $?"
grep -E "gated_gemm|sm90_|Kernel|Duration|Throughput|gmma|lts__t|Registers|Warp Cycles|Eligible|Issued Warp|No Eligible|L2 Hit|Grid Size|Cluster|Waves|Stall" "$OUT/ncu.log" | cut -c1-150 | head -100
for arm in 0 256; do
  TWINSTEP_GATED_GEMM=$arm part "prefill_$arm" 120 "$BIN/engine_throughput_bench" --prefill
  grep -E "gated gate|prefill 16x2048|GEMM|gelu" "$OUT/prefill_$arm.log" | head -10
done
for arm in 256 17; do
  TWINSTEP_GATED_GEMM=$arm TWINSTEP_BENCH_QUICK=1 part "decode_$arm" 120 "$BIN/engine_throughput_bench" --decode
  grep -E "gated gate|^\| decode" "$OUT/decode_$arm.log" | head -10
done
t done
