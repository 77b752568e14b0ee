#!/usr/bin/env bash
# perf/gpu_s21_any.sh (session 21, one call on whichever card comes, H100 or H200): the decode A/B
# of the folded q/k/v write (quick bench, one process an arm; on an 80 GB card the table stops at
# b=64), then gates under the folded write (TWINSTEP_QKV_WRITE=attention, the path its default
# would take): first tensor parallelism on one GPU (TpGates, TpLoopbackGates, NcclGates), then
# split decode, decode graphs, the gated GEMM (clusters of four) and the model gates, in what is
# left of the call (END_S, default 570 s after the start).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_keep_going
t built
for arm in def attn; do
  qkv_arm "dec_$arm" $arm
  echo "$arm: $(grep -E "^\| decode b=(1|16|64|128) " "$OUT/dec_$arm.log" |
    awk -F'|' '{printf "%s %s; ", $2, $4}')"
done
t arms
gates() {  # gates NAME REGEX
  local left=$((${END_S:-570} - ($(date +%s) - start)))
  [ $left -lt 20 ] && { echo "$1: no time left"; return; }
  TWINSTEP_QKV_WRITE=attention timeout $left ctest --preset gpu-gates -R "$2" > "$OUT/$1.log" 2>&1
  echo "$1 ctest: exit $? (limit $left s)"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/$1.log" | head -12
  grep -E "\[gate\] (gated GEMM resident|NCCL|TP|g12b TP|gsoft TP)" "$OUT/$1.log" | cut -c1-260 | head -12
}
gates tp "TpGates|TpLoopbackGates|NcclGates"
t tp
gates rest "DecodeSplitGates|DecodeGraphGates|GatedGemmGates|ModelGates"
t done
cd "$OUT" && gzip -9 ./*.log
