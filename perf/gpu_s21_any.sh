#!/usr/bin/env bash
# perf/gpu_s21_any.sh (session 21, one call on whichever card comes, H100 or H200): the gates
# of what sessions 19-21 changed, with the folded q/k/v write on (TWINSTEP_QKV_WRITE=attention,
# the path its default would take): tensor parallelism on one GPU (TpGates, TpLoopbackGates),
# NCCL one rank, the gated GEMM (clusters of four), split decode, decode graphs, model gates;
# then the decode A/B of the folded write, one quick bench process an arm (on an 80 GB card the
# table stops at b=64).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
# Every target that compiles (-k 0): a gate that does not compile fails alone in ctest.
{ cmake --preset gpu-gates && cmake --build build/gpu-gates -j16 -- -k 0; } > /tmp/build.log 2>&1 ||
  grep -m 20 -E "error" /tmp/build.log
t built
TWINSTEP_QKV_WRITE=attention timeout "${CTEST_TIMEOUT:-400}" ctest --preset gpu-gates \
  -R "${CTEST_REGEX:-TpGates|TpLoopbackGates|NcclGates|GatedGemmGates|DecodeSplitGates|DecodeGraphGates|ModelGates}" \
  > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
grep -E "\[gate\] (gated GEMM resident|NCCL|TP|g12b TP|gsoft TP)" "$OUT/ctest.log" | cut -c1-240 | head -20
t gates
for arm in def attn; do
  v=""
  [ $arm = attn ] && v=attention
  TWINSTEP_QKV_WRITE=$v TWINSTEP_BENCH_QUICK=1 part "dec_$arm" 90 \
    build/gpu-gates/bin/engine_throughput_bench --decode
  echo "$arm: $(grep -E "^\| decode b=(1|16|64|128) " "$OUT/dec_$arm.log" |
    awk -F'|' '{printf "%s %s; ", $2, $4}')"
done
t done
cd "$OUT" && gzip -9 ctest.log && tar czf dec_logs.tgz ./dec_*.log && rm -f ./dec_*.log
