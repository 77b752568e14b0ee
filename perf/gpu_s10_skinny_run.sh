#!/usr/bin/env bash
# perf/gpu_s10_skinny_run.sh (session 10; issue 13): the streamed few-row GEMM (gemm_stream.h,
# 256-k units, programmatic) only where it read faster than cuBLAS: at b=16 only (rows 9-16),
# and/or only for the small matrices (wmax=70: q|k|v and o_proj of both families, not gate|up,
# down or the LM head). One process an arm, engine_throughput_bench --decode, quick, under $OUT:
#   off1, r16 (9-16), w70 (1-16,wmax=70), rw (9-16,wmax=70), off2 .log
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
for arm in off1: r16:9-16,k256 w70:1-16,k256,wmax=70 rw:9-16,k256,wmax=70 off2:; do
  name=${arm%%:*}
  value=${arm#*:}
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "$name" 120 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/$name.log"
done
t done
