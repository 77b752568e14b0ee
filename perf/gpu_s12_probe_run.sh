#!/usr/bin/env bash
# perf/gpu_s12_probe_run.sh (session 12, issue 12): what bounds the gated GEMM at 8192 rows.
# skinny_gemm_bench --gated-probe (design variants in turns, bitwise checks, ~2.5 s sustained
# segments) beside an nvidia-smi log of SM clock and power, summarised per segment; then ncu of
# cuBLAS's gate|up, the gated GEMM and its tensor-store variant (clock control none).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates skinny_gemm_bench gated_gemm_gates
t built
BIN=build/gpu-gates/bin
part gates 60 "$BIN/gated_gemm_gates"
SUMMARY_CUT=200 summary "$OUT/gates.log" | grep -E "OK|FAIL|12B|windows"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
part probe 200 "$BIN/skinny_gemm_bench" --gated-probe
kill $smi
grep -v "^SEG" "$OUT/probe.log" | tail -30
python3 "$(dirname "${BASH_SOURCE[0]}")/seg_clocks.py" "$OUT/probe.log" "$OUT/smi.csv"
ncu --clock-control none --profile-from-start off --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes.sum.per_second,sm__warps_active.avg.pct_of_peak_sustained_active \
  "$BIN/skinny_gemm_bench" --gated-profile > "$OUT/ncu.log" 2>&1
echo "== ncu exit $?"
grep -E "gated_gemm|nvjet|sm90|gpu__time|per_second|pct|sectors" "$OUT/ncu.log" | cut -c1-150 | head -40
t done
