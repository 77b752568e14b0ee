#!/usr/bin/env bash
# perf/gpu_s15_trace_run.sh (session 15): where the decode steps go now (issue 13) and how the
# prefill steps of one run spread (issue 12). Builds engine_throughput_bench, then under $OUT:
#   trace.log    engine_throughput_bench --decode, quick, TWINSTEP_BENCH_TRACE=1: the CUPTI
#                timeline of one graph-replayed and one eager step per batch
#   prefill.log  engine_throughput_bench --prefill (defaults), each step's time
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part prefill 60 "$BIN/engine_throughput_bench" --prefill
grep -E "steps, |each step|^\| prefill|^  attention|forward \(GPU|observed" "$OUT/prefill.log"
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part trace 200 "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace|kernels \(|^\| decode" "$OUT/trace.log" | head -40
t done
