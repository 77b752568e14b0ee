#!/usr/bin/env bash
# perf/gpu_s16_norm_run.sh (session 16): the persistent residual_norm (issue 12) and where the
# prefill run's slow step comes from. Builds kernel_gates, kernel_bandwidth_bench and
# engine_throughput_bench, then under $OUT:
#   norm_gate.log   KernelGates.ResidualNorm* (the persistent kernel bitwise against the sequence,
#                   the block-per-row kernel and the reference)
#   bandwidth.log   kernel_bandwidth_bench (residual_norm persistent vs row blocks vs reference)
#   observe.log     engine_throughput_bench --prefill, 32 prompts, every step observed (phases,
#                   wall-clock start), beside smi.csv (nvidia-smi every 20 ms: SM clock, power,
#                   temperature, throttle reasons)
#   prefill_N.log   engine_throughput_bench --prefill, defaults, twice
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates kernel_gates kernel_bandwidth_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part norm_gate 120 "$BIN/kernel_gates" --gtest_filter='*ResidualNorm*'
summary "$OUT/norm_gate.log"
part bandwidth 120 "$BIN/kernel_bandwidth_bench"
grep -E "copy|residual_norm|row blocks|reference" "$OUT/bandwidth.log"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 20 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|OBSERVED|^\| prefill|^  attention|^  norms|forward \(GPU" "$OUT/observe.log"
for i in 1 2; do
  part prefill_$i 60 "$BIN/engine_throughput_bench" --prefill
  grep -E "steps, |each step|^\| prefill|^  attention|^  norms|forward \(GPU" "$OUT/prefill_$i.log"
done
t done
