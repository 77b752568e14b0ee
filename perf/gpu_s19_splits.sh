#!/usr/bin/env bash
# perf/gpu_s19_splits.sh (session 19): the split-KV decode attention's split count at small
# batch, measured before any policy change. TWINSTEP_DECODE_SPLITS_MAX=N caps the policy's count
# (b=1: local 33 splits of one 32-key tile, global 132 of which ~35 hold keys at ~1.1k context).
# The decode split gates under a cap (the split changes, the bits are the gates' to check), the
# kernel-only bench at each cap, then the engine's quick decode, one process an arm, alternating.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates engine_throughput_bench decode_attention_bench decode_split_gates
t built
BIN=build/gpu-gates/bin
part gates_def 120 "$BIN/decode_split_gates"
summary "$OUT/gates_def.log" | tail -4
TWINSTEP_DECODE_SPLITS_MAX=8 part gates_cap8 120 "$BIN/decode_split_gates" \
  --gtest_filter='*MatchesReferenceAndFp64:*RepeatRuns*:*FusedMerge*'
summary "$OUT/gates_cap8.log" | tail -8
for cap in "" 16 8 4; do
  TWINSTEP_DECODE_SPLITS_MAX=$cap part "kern_${cap:-def}" 60 "$BIN/decode_attention_bench" --no-reference
  grep -E "^ +(1|16) +(1024|8192) " "$OUT/kern_${cap:-def}.log"
done
for round in 1 2; do
  for cap in "" 16 8; do
    TWINSTEP_DECODE_SPLITS_MAX=$cap TWINSTEP_BENCH_QUICK=1 part "dec_${cap:-def}_$round" 60 \
      "$BIN/engine_throughput_bench" --decode
    grep -E "^\| decode b=(1|16) " "$OUT/dec_${cap:-def}_$round.log"
  done
done
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
