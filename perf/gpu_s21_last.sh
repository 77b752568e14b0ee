#!/usr/bin/env bash
# perf/gpu_s21_last.sh (session 21, for the last ~7 minutes of device budget): the decode A/B of
# the folded q/k/v write (quick bench, one process an arm), then the tensor-parallel gates on one
# GPU (TpGates, TpLoopbackGates) in what is left (END_S after the start, default 400).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_keep_going engine_throughput_bench tp_gates tp_loopback_gates
t built
# SKIP_AB=1: the gates only (a budget of ~4 minutes).
for arm in $([ -n "${SKIP_AB:-}" ] || echo def attn); do
  qkv_arm "dec_$arm" $arm 80
  echo "$arm: $(grep -E "^\| decode b=(1|16|64|128) " "$OUT/dec_$arm.log" |
    awk -F'|' '{printf "%s %s; ", $2, $4}')"
done
t arms
left=$((${END_S:-400} - ($(date +%s) - start)))
if [ $left -gt 20 ]; then
  timeout $left ctest --preset gpu-gates -R "TpGates|TpLoopbackGates" \
    > "$OUT/tp.log" 2>&1
  echo "tp ctest: exit $? (limit $left s)"
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*|\[gate\]|Failure|Expected|Which is|rror" \
    "$OUT/tp.log" | cut -c1-260 | head -30
fi
t done
cd "$OUT" && gzip -9 ./*.log
