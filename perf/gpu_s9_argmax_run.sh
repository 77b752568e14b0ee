#!/usr/bin/env bash
# perf/gpu_s9_argmax_run.sh (session 9, call 3): the cluster argmax. Builds kernel_gates and
# engine_throughput_bench; runs KernelGates.Argmax and the decode trace (exclusive times).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates kernel_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part argmax 60 "$BIN/kernel_gates" --gtest_filter='KernelGates.Argmax'
summary "$OUT/argmax.log"
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part trace "${LIMIT_TRACE:-200}" \
  "$BIN/engine_throughput_bench" --decode
for b in 1 16; do sed -n "/trace: decode b=$b, graphs/,/gap/p" "$OUT/trace.log" | cut -c1-170; done
grep -E "^\| decode|graphs: .* ms/step" "$OUT/trace.log"
t done
