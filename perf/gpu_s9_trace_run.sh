#!/usr/bin/env bash
# perf/gpu_s9_trace_run.sh (session 9, call 1; issue 13): where the b=1 and b=16 decode steps
# go, before any change. Builds decode_attention_bench and engine_throughput_bench here, then
# under $OUT:
#   trace.log   engine_throughput_bench --decode, quick, TWINSTEP_BENCH_TRACE=1: the CUPTI
#               timeline of one graph-replayed and one eager step per batch (kernels, busy,
#               idle, overlap; kernels grouped by name; the longest gaps)
#   bench.log   decode_attention_bench --no-reference (the kernel-only table, same process copy)
#   ncu_*.txt   ncu (clock control none, cache control all) of the split-KV kernel (and merge)
#               at local b=1, global b=1 and local b=16, 1k context
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates decode_attention_bench engine_throughput_bench
grep -E "CUPTI" /tmp/build.log | head -3
t built
BIN=build/gpu-gates/bin
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part trace "${LIMIT_TRACE:-200}" \
  "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace|kernels \(|^\| decode" "$OUT/trace.log"
[ -n "$SKIP_NCU" ] && { t done; exit 0; }
part bench "${LIMIT_BENCH:-40}" "$BIN/decode_attention_bench" --no-reference
sections="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters"
for c in local:1:1024 global:1:1024 local:16:1024; do
  t0=$(date +%s)
  f="$OUT/ncu_${c//:/_}.txt"
  # shellcheck disable=SC2086
  timeout "${LIMIT_NCU:-90}" ncu --clock-control none --cache-control all $sections \
    -k regex:decode_ --launch-skip 2 --launch-count 2 \
    "$BIN/decode_attention_bench" --only "$c" --no-reference > "$f" 2>&1
  echo "== ncu $c: exit $?, $(($(date +%s) - t0)) s"
  grep -E "decode_|Duration|DRAM Throughput|Achieved Occupancy|No Eligible|Registers Per" "$f" |
    head -16
done
t done
