#!/usr/bin/env bash
# perf/gpu_s18_run.sh (written in session 17 for the next call): every gate with the streamed
# few-row GEMM from one row (TWINSTEP_SKINNY=1-16,k256: the default proposed by session 17's
# b=1 A/B, -0.07 ms; Blas::create reads it in every gate process, and gates that pin their
# own row range keep theirs), then the decode A/B again, then the observed prefill beside an
# nvidia-smi log of clocks, power and throttle reasons (session 17's one-slow-step-in-three).
# Logs under $OUT, packed into all_logs.tgz at the end (8 files come back at most).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates
t built
TWINSTEP_SKINNY=1-16,k256 timeout "${CTEST_TIMEOUT:-420}" ctest --preset gpu-gates \
  > "$OUT/ctest.log" 2>&1
echo "ctest (streamed from one row): exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
decode_arms def_1: s1_1:1-16,k256 def_2: s1_2:1-16,k256
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|OBSERVED|^\| prefill" "$OUT/observe.log"
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log smi.csv && rm -f ./*.log smi.csv
