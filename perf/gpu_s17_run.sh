#!/usr/bin/env bash
# perf/gpu_s17_run.sh (session 17): on the H200, under $OUT:
#   norm_gate.log     KernelGates.ResidualNorm* (row blocks, persistent, reference, bitwise)
#   bandwidth.log     kernel_bandwidth_bench (residual_norm: row blocks vs persistent)
#   observe.log       engine_throughput_bench --prefill, 32 prompts, every step observed (phases,
#                     wall-clock start), beside smi.csv (nvidia-smi every 50 ms: SM clock,
#                     power, temperature, throttle reasons): session 15's slow third step
#   pf_{rows,pers}_1  engine prefill 16 x 2048 with TWINSTEP_BENCH_RESIDUAL_NORM=rows|persistent,
#                     one process an arm
#   dec_{def,s1}_N    engine decode (quick): the default few-row GEMM (streamed at 9..16 rows)
#                     against TWINSTEP_SKINNY=1-16,k256 (streamed at every decode row count)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates kernel_gates kernel_bandwidth_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part norm_gate 120 "$BIN/kernel_gates" --gtest_filter='*ResidualNorm*'
summary "$OUT/norm_gate.log"
part bandwidth 120 "$BIN/kernel_bandwidth_bench"
grep -E "copy|residual_norm|persistent|reference" "$OUT/bandwidth.log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|OBSERVED|^\| prefill" "$OUT/observe.log"
for arm in rows_1:rows pers_1:persistent; do
  TWINSTEP_BENCH_RESIDUAL_NORM=${arm#*:} part "pf_${arm%%:*}" 60 "$BIN/engine_throughput_bench" --prefill
  grep -E "steps, |each step|^\| prefill|^  norms" "$OUT/pf_${arm%%:*}.log"
done
for arm in def_1: s1_1:1-16,k256 def_2: s1_2:1-16,k256; do
  name=${arm%%:*}
  value=${arm#*:}
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_$name" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_$name.log"
done
t done
cd "$OUT" && tar czf all_logs.tgz *.log smi.csv 2>/dev/null && rm -f *.log smi.csv
