#!/usr/bin/env bash
# perf/gpu_s9_launch_run.sh (session 9, last call): how long the host's cudaGraphLaunch of a
# decode bucket takes (CudaDevice::HostPhases::graph_launch_us), programmatic launches on and
# off, one process each (engine_throughput_bench --decode, quick).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates engine_throughput_bench
t built
for pdl in 1 0; do
  TWINSTEP_DECODE_PDL=$pdl TWINSTEP_BENCH_QUICK=1 timeout 100 \
    build/gpu-gates/bin/engine_throughput_bench --decode > "$OUT/pdl$pdl.log" 2>&1
  echo "== pdl $pdl: exit $?"
  grep -E "== decode batch|median .* ms/step|host path|host phases" "$OUT/pdl$pdl.log" | cut -c1-200
done
t done
