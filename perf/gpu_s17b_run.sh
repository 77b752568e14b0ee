#!/usr/bin/env bash
# perf/gpu_s17b_run.sh (session 17; run on the H200 as it stood at 501b560): the kernels'
# bandwidth (then with session 16's persistent residual_norm beside the row blocks, since
# removed), the b=1 decode A/B (default vs TWINSTEP_SKINNY=1-16,k256, one process an arm,
# alternating), then the observed prefill (32 prompts, every step's phases and start time).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
# An 80 GB card (H100) cannot hold the decode pools of batch 128: the table stops at 64 there.
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mib:-0}" -lt 100000 ] && export TWINSTEP_BENCH_DECODE_MAX_BATCH=64
build_gates kernel_bandwidth_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part bandwidth 60 "$BIN/kernel_bandwidth_bench"
grep -E "copy|residual_norm|reference" "$OUT/bandwidth.log"
for arm in def_1: s1_1:1-16,k256 def_2: s1_2:1-16,k256; do
  name=${arm%%:*}
  value=${arm#*:}
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_$name" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_$name.log"
done
unset TWINSTEP_SKINNY
TWINSTEP_BENCH_PREFILL_OBSERVE=1 TWINSTEP_BENCH_PREFILL_REQUESTS=32 \
  part observe 90 "$BIN/engine_throughput_bench" --prefill
grep -E "steps, |each step|OBSERVED|^\| prefill" "$OUT/observe.log"
t done
