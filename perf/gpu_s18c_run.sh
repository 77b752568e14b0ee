#!/usr/bin/env bash
# perf/gpu_s18c_run.sh (session 18, call C: the H200, ~170 s): the decode A/B of call B on the
# H200 (one process an arm, alternating: the default = from one row with the GELU folded into
# the gate|up GEMM; TWINSTEP_SKINNY=1-16,k256 = from one row, gelu_tanh_mul apart; 9-16,k256 =
# session 17's default), a CUPTI kernel timeline of each decode batch, the new gate's lines on this card, then the observed prefill beside an
# nvidia-smi log of clocks, power and throttle reasons.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mib:-0}" -lt 100000 ] && export TWINSTEP_BENCH_DECODE_MAX_BATCH=64
build_gates engine_throughput_bench skinny_gemm_gates
t built
BIN=build/gpu-gates/bin
for arm in def_1: nog_1:1-16,k256 old_1:9-16,k256 def_2: nog_2:1-16,k256 old_2:9-16,k256; do
  value=${arm#*:}  # empty: the default (TWINSTEP_SKINNY unset; "" would be a create() error)
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_${arm%%:*}" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_${arm%%:*}.log"
done
unset TWINSTEP_SKINNY
# The kernel timeline (CUPTI) of a decode step at each batch, graphs and eager: where the b=1
# step's time outside the weight GEMMs goes, kernel by kernel, with the idle gaps.
TWINSTEP_BENCH_QUICK=1 TWINSTEP_BENCH_TRACE=1 part trace 100 "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace|idle" "$OUT/trace.log" | head -20
part gated 60 "$BIN/skinny_gemm_gates" --gtest_filter='StreamGemmGates.Gated*'
summary "$OUT/gated.log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|^\| prefill" "$OUT/observe.log"
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log smi.csv && rm -f ./*.log smi.csv
