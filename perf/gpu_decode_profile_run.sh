#!/usr/bin/env bash
# perf/gpu_decode_profile_run.sh: ncu of the local split-KV decode kernel at batch 16 (issue 13,
# written in session 8 for the next call: the largest gap left at b=16, 0.054 ms a layer for
# 134 MB, 60% of copy; perf/NOTES.md "What is left after session 8"). Builds
# decode_attention_bench here, then under $OUT:
#   bench.log   decode_attention_bench --no-reference (the whole table, for the same process's
#               copy figure and the b=16 / b=64 rows side by side)
#   ncu_b16.txt ncu (clock control none, cache control all) of decode_split_kernel<256> and its
#               merge at local b=16 x 1k: SpeedOfLight, WarpStateStats, LaunchStats, Occupancy,
#               MemoryWorkloadAnalysis, SchedulerStats, SourceCounters (the stall per SASS line)
#   ncu_b64.txt the same at b=64 (89% of copy: what differs)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
{ cmake --preset gpu-gates && cmake --build build/gpu-gates -j16 --target decode_attention_bench; } \
  > /tmp/build.log 2>&1 || { grep -m 30 -E "error|Error" /tmp/build.log; exit 1; }
t built
BIN=build/gpu-gates/bin
part bench "${LIMIT_BENCH:-30}" "$BIN/decode_attention_bench" --no-reference
sections="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters"
for b in 16 64; do
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout "${LIMIT_NCU:-120}" ncu --clock-control none --cache-control all $sections \
    -k regex:decode_ --launch-skip 2 --launch-count 2 \
    "$BIN/decode_attention_bench" --only "local:$b:1024" --no-reference > "$OUT/ncu_b$b.txt" 2>&1
  echo "== ncu b=$b: exit $?, $(($(date +%s) - t0)) s"
  grep -E "decode_|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots|Eligible|No Eligible|Registers Per|Waves Per SM" \
    "$OUT/ncu_b$b.txt" | head -40
done
grep -E "^ *(16|64) +1024 " "$OUT/bench.log"
