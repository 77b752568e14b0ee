#!/usr/bin/env bash
# perf/gpu_s10_profile_run.sh (session 10, call 1; issue 13): before any change, where the b=16
# decode step's local split-KV attention goes. Builds decode_attention_bench and
# engine_throughput_bench here, then under $OUT:
#   trace.log   engine_throughput_bench --decode, quick, TWINSTEP_BENCH_TRACE=1 (the CUPTI
#               timeline of one graph and one eager step per batch, kernels by exclusive time)
#   bench.log   decode_attention_bench --no-reference (kernel-only table, same-process copy)
#   ncu_b16.txt ncu (clock control none, cache control all) of the local split kernel at
#               b=16 x 1k: speed of light, warp states, memory, scheduler, source counters
#   ncu_b64.txt the same at b=64 (89% of copy there: what differs)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates decode_attention_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part bench "${LIMIT_BENCH:-40}" "$BIN/decode_attention_bench" --no-reference
grep -E "copy|^ *local|^ *(1|16|64|128) " "$OUT/bench.log" | head -30
sections="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters"
for b in 16 64; do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${LIMIT_NCU:-90}" ncu --clock-control none --cache-control all $sections \
    -k regex:decode_split --launch-skip 2 --launch-count 1 \
    "$BIN/decode_attention_bench" --only "local:$b:1024" --no-reference > "$OUT/ncu_b$b.txt" 2>&1
  echo "== ncu b=$b: exit $?, $(($(date +%s) - t0)) s"
done
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part trace "${LIMIT_TRACE:-200}" \
  "$BIN/engine_throughput_bench" --decode
grep -E "^\| decode|graphs: .* ms/step" "$OUT/trace.log" | head -20
t done
