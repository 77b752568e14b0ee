#!/usr/bin/env bash
# perf/gpu_s10_pieces_run.sh (session 10; issue 13): decode graphs in pieces. Builds
# decode_graph_gates and engine_throughput_bench here, then under $OUT:
#   gates.log    decode_graph_gates (all, the new GraphsInPiecesReplayTheOneGraphBits among them)
#   p1a/p4/p1b/p2.log  engine_throughput_bench --decode, quick, one process an arm, with
#                TWINSTEP_DECODE_GRAPH_PIECES = 1, 4, 1 again (the noise between processes), 2
#   p4trace.log  the 4-piece arm again, traced (CUPTI), for the gap before the first kernel
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates decode_graph_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 200 "$BIN/decode_graph_gates"
summary "$OUT/gates.log"
for arm in p1a:1 p4:4 p1b:1 p2:2; do
  name=${arm%%:*}
  TWINSTEP_DECODE_GRAPH_PIECES=${arm##*:} TWINSTEP_BENCH_QUICK=1 part "$name" 120 \
    "$BIN/engine_throughput_bench" --decode
  grep -E "piece|^\| decode|graphs: .* ms/step|host phases" "$OUT/$name.log" | head -16
done
TWINSTEP_BENCH_TRACE=1 TWINSTEP_DECODE_GRAPH_PIECES=4 TWINSTEP_BENCH_QUICK=1 part p4trace 120 \
  "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace.*graphs|span|gap" "$OUT/p4trace.log" | head -40
t done
