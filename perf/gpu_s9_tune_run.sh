#!/usr/bin/env bash
# perf/gpu_s9_tune_run.sh (session 9, call 5; issue 13): the decode buckets' GEMMs tuned inside
# captured graphs (TWINSTEP_GEMM_TUNE_GRAPHS, default on) against in a stream, one process an
# arm, same binary; the fused ("sized") merge beside. gemm_lt_gates first (the tuner path).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates gemm_lt_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part lt 150 "$BIN/gemm_lt_gates"
SUMMARY_CUT=250 LINES_MAX=20 summary "$OUT/lt.log"
arm() {  # arm NAME ENV...
  local name=$1
  shift
  env "$@" TWINSTEP_BENCH_QUICK=1 TWINSTEP_BENCH_TRACE=1 timeout 150 \
    "$BIN/engine_throughput_bench" --decode > "$OUT/$name.log" 2>&1
  echo "== $name ($*): exit $?"
  grep -E "GEMM tuning|^\| decode" "$OUT/$name.log"
  for b in 1 16; do
    sed -n "/trace: decode b=$b, graphs/,/gap/p" "$OUT/$name.log" | grep -E "kernels \(|memset|nvjet" | cut -c1-150
  done
}
arm tune_graphs TWINSTEP_GEMM_TUNE_GRAPHS=1
arm tune_stream TWINSTEP_GEMM_TUNE_GRAPHS=0
arm graphs_sized TWINSTEP_GEMM_TUNE_GRAPHS=1 TWINSTEP_DECODE_MERGE=sized
arm tune_graphs2 TWINSTEP_GEMM_TUNE_GRAPHS=1
t done
