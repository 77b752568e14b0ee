#!/usr/bin/env bash
# perf/gpu_s18d_trace.sh (session 18, call D, ~90 s on whichever card comes): the CUPTI kernel
# timeline of a decode step at each batch (graphs and eager) on the new defaults, to see where
# the b=1 step's time outside the weight GEMMs goes, kernel by kernel, with the idle gaps.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mib:-0}" -lt 100000 ] && export TWINSTEP_BENCH_DECODE_MAX_BATCH=64
build_gates engine_throughput_bench
t built
TWINSTEP_BENCH_QUICK=1 TWINSTEP_BENCH_TRACE=1 part trace 100 \
  build/gpu-gates/bin/engine_throughput_bench --decode
grep -E "^-- trace|idle|^\| decode" "$OUT/trace.log" | head -30
awk '/^-- trace: decode b=1, graphs/{on=1} /^-- trace: decode b=1, eager/{on=0} on' \
  "$OUT/trace.log" | head -40
t done
