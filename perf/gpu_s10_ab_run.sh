#!/usr/bin/env bash
# perf/gpu_s10_ab_run.sh (session 10; issue 13): decode graphs in pieces and the GEMM tuner's
# memset charge, one process an arm. Builds decode_graph_gates and engine_throughput_bench
# here, then under $OUT:
#   gates.log   decode_graph_gates (all)
#   a1 / a4 / m4 / b1 .log  engine_throughput_bench --decode, quick: TWINSTEP_DECODE_GRAPH_PIECES
#               1, 4, 4 with TWINSTEP_GEMM_MEMSET_PENALTY=4, then 1 again (process noise)
#   m4trace.log the memset arm traced (CUPTI): the memset nodes left
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates decode_graph_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 200 "$BIN/decode_graph_gates"
summary "$OUT/gates.log"
for arm in a1:1:0 a4:4:0 m4:4:4 b1:1:0; do
  IFS=: read -r name pieces penalty <<< "$arm"
  TWINSTEP_DECODE_GRAPH_PIECES=$pieces TWINSTEP_GEMM_MEMSET_PENALTY=$penalty TWINSTEP_BENCH_QUICK=1 \
    part "$name" 120 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode|launch call" "$OUT/$name.log" | cut -c1-60,100-200 | head -12
done
TWINSTEP_BENCH_TRACE=1 TWINSTEP_GEMM_MEMSET_PENALTY=4 TWINSTEP_BENCH_QUICK=1 part m4trace 120 \
  "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace.*graphs|span|memset" "$OUT/m4trace.log" | head -30
t done
