#!/usr/bin/env bash
# perf/gpu_s13_arms_run.sh (session 13, issue 12): the engine's prefill step, one process an arm
# and three rounds: the gated GEMM in lone blocks, in clusters of two (from 512 rows) with the
# registers, staged and tensor-store epilogues; the host line (with the forward's set-up before
# its first kernel) and the gate_up phase of each. The first pairs arm runs under the CUPTI
# timeline. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gated_gemm_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 60 "$BIN/gated_gemm_gates"
SUMMARY_CUT=200 summary "$OUT/gates.log" | grep -E "OK|FAIL|rror|xpected"
n=0
for round in 1 2 3; do
  for arm in lone registers staged tma; do
    n=$((n + 1))
    env_arm=()
    [ $arm != lone ] && env_arm=(TWINSTEP_GATED_GEMM_PAIRS=512 TWINSTEP_GATED_GEMM_EPILOGUE=$arm)
    [ $n -eq 2 ] && env_arm+=(TWINSTEP_BENCH_TRACE=1)
    part "prefill_${n}_$arm" 90 env "${env_arm[@]}" "$BIN/engine_throughput_bench" --prefill
    echo "$arm: $(grep -E "^\| prefill 16x2048" "$OUT/prefill_${n}_$arm.log" | cut -c1-60) $(grep -E "gate_up gemm" "$OUT/prefill_${n}_$arm.log" | head -1)"
    grep -oE "launch [0-9.]+ \(of it the forward's set-up before its first kernel [0-9.]+\)" "$OUT/prefill_${n}_$arm.log"
  done
done
t done
