#!/usr/bin/env bash
# perf/gpu_s20_h100.sh (session 20, for an H100 when no H200 comes; one call): the decode A/B of
# the folded q/k/v write (quick bench, two rounds in turns; on an 80 GB card the table stops at
# b=64), then the gates of what this session changed with the folded write on
# (TWINSTEP_QKV_WRITE=attention: the path its default would take): gated GEMM (clusters of
# four), NCCL (one rank), split decode, decode graphs, model gates.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates
t built
for round in 1 2; do
  for arm in def attn; do
    qkv_arm "dec_${arm}_$round" $arm
    echo "$arm $round: $(grep -E "^\| decode b=(1|16|64) " "$OUT/dec_${arm}_$round.log" |
      awk -F'|' '{printf "%s %s; ", $2, $4}')"
  done
done
t arms
# The gates with the folded write on (gpu_s20_gates.sh builds nothing more: the tree is built).
TWINSTEP_QKV_WRITE=attention CTEST_TIMEOUT=330 bash "$(dirname "${BASH_SOURCE[0]}")/gpu_s20_gates.sh"
cd "$OUT" && tar czf logs.tgz ./*.log && rm -f ./*.log
