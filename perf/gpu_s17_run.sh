#!/usr/bin/env bash
# perf/gpu_s17_run.sh (session 17): session 16's persistent residual_norm and slow-step
# diagnosis (perf/gpu_s16_norm_run.sh, run first), then b=1 decode with the streamed few-row
# GEMM at every decode row count (TWINSTEP_SKINNY=1-16,k256) against the default (9..16 rows),
# one process an arm, alternating: $OUT/dec_{def,s1}_{1,2}.log.
here="$(dirname "${BASH_SOURCE[0]}")"
bash "$here/gpu_s16_norm_run.sh"
. "$here/gpu_env.sh"
BIN=build/gpu-gates/bin
for arm in def_1: s1_1:1-16,k256 def_2: s1_2:1-16,k256; do
  name=${arm%%:*}
  value=${arm#*:}
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_$name" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_$name.log"
done
t done
