#!/usr/bin/env bash
# perf/gpu_s13_epilogue_run.sh (session 13, issue 12): where the gated GEMM's epilogue cost goes
# (skinny_gemm_bench --gated-probe: no stores, tanh.approx, tensor stores, beside an nvidia-smi
# log of clock and power per sustained segment), its gates (tensor stores bitwise), then the
# engine's prefill step one process an arm: lone blocks, pairs from 512 rows, pairs with tensor
# stores (twice each, interleaved; the first under the CUPTI kernel timeline). Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gated_gemm_gates skinny_gemm_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 60 "$BIN/gated_gemm_gates"
SUMMARY_CUT=200 summary "$OUT/gates.log" | grep -E "OK|FAIL|12B|windows|rror|xpected"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
part probe 150 "$BIN/skinny_gemm_bench" --gated-probe
kill $smi
grep -v "^SEG" "$OUT/probe.log" | tail -24
python3 "$(dirname "${BASH_SOURCE[0]}")/seg_clocks.py" "$OUT/probe.log" "$OUT/smi.csv"
t probed
n=0
for arm in lone pairs tma lone pairs tma; do
  n=$((n + 1))
  case $arm in
    lone) env_arm=() ;;
    pairs) env_arm=(TWINSTEP_GATED_GEMM_PAIRS=512) ;;
    tma) env_arm=(TWINSTEP_GATED_GEMM_PAIRS=512 TWINSTEP_GATED_GEMM_EPILOGUE=tma) ;;
  esac
  [ $n -eq 1 ] && env_arm+=(TWINSTEP_BENCH_TRACE=1)
  part "prefill_${n}_$arm" 90 env "${env_arm[@]}" "$BIN/engine_throughput_bench" --prefill
  grep -E "gated gate|prefill 16x2048|gate_up gemm|attention  |norms" "$OUT/prefill_${n}_$arm.log" | head -6
done
t done
