#!/usr/bin/env bash
# perf/gpu_s18_run.sh (written in session 17 for the next call): every gate with the streamed
# few-row GEMM from one row (TWINSTEP_SKINNY=1-16,k256: the default proposed by session 17's
# b=1 A/B, -0.07 ms; Blas::create reads it in every gate process, and gates that pin their
# own row range keep theirs), then the decode A/B again, then the observed prefill beside an
# nvidia-smi log of clocks, power and throttle reasons (session 17's one-slow-step-in-three).
# Logs under $OUT, packed into all_logs.tgz at the end (8 files come back at most).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mib:-0}" -lt 100000 ] && export TWINSTEP_BENCH_DECODE_MAX_BATCH=64
build_gates
t built
TWINSTEP_SKINNY=1-16,k256 timeout "${CTEST_TIMEOUT:-420}" ctest --preset gpu-gates \
  > "$OUT/ctest.log" 2>&1
echo "ctest (streamed from one row): exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
for arm in def_1: s1_1:1-16,k256 def_2: s1_2:1-16,k256; do
  value=${arm#*:}  # empty: the default (TWINSTEP_SKINNY unset; "" would be a create() error)
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_${arm%%:*}" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_${arm%%:*}.log"
done
unset TWINSTEP_SKINNY
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|OBSERVED|^\| prefill" "$OUT/observe.log"
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log smi.csv && rm -f ./*.log smi.csv
