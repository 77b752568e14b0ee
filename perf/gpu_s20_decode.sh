#!/usr/bin/env bash
# perf/gpu_s20_decode.sh (written in session 19 for the next session's first call, ~250 s on
# an H200): issue 13's b=1 step (7.33-7.39 ms against <= 7.3 in session 19). Two candidates,
# both opt-in, neither yet run on a GPU:
#   TWINSTEP_QKV_WRITE=attention  the q/k/v write folded into the split attention
#                                 (attention_decode_split_write; one launch less a layer)
#   TWINSTEP_DECODE_SPLITS_MAX=N  the split count capped (b=1: local 33 splits, global 132)
# The split gates first (the new FusedQkvWriteEqualsWriteThenAttention among them, and the
# whole binary under a cap), then the engine's quick decode, one process an arm, alternating,
# then the b=1 timeline of the folded write.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates engine_throughput_bench decode_split_gates decode_graph_gates model_gates \
  decode_attention_bench
t built
BIN=build/gpu-gates/bin
part gates 120 "$BIN/decode_split_gates"
summary "$OUT/gates.log" | tail -12
# Under a cap the policy gates (split counts, kSized's choice) no longer hold by design: the
# numeric and bitwise ones must.
TWINSTEP_DECODE_SPLITS_MAX=8 part gates_cap8 120 "$BIN/decode_split_gates" \
  --gtest_filter='*MatchesReferenceAndFp64:*RepeatRuns*:*FusedMerge*:*FusedQkvWrite*'
grep -E "tests? ran|PASSED|FAILED" "$OUT/gates_cap8.log" | head -4
# The kernel alone at each cap (b=1 and 16 at 1k and 8k keys).
for cap in "" 16 8 4; do
  TWINSTEP_DECODE_SPLITS_MAX=$cap part "kern_${cap:-def}" 60 "$BIN/decode_attention_bench" \
    --no-reference
  grep -E "^ +(1|16) +(1024|8192) " "$OUT/kern_${cap:-def}.log"
done
arm() {  # arm NAME VAR=VALUE...
  local name=$1
  shift
  env "$@" TWINSTEP_BENCH_QUICK=1 timeout 60 "$BIN/engine_throughput_bench" --decode \
    > "$OUT/dec_$name.log" 2>&1
  echo "== $name ($*): exit $?"
  grep -E "^\| decode b=(1|16|64|128) " "$OUT/dec_$name.log"
}
for round in 1 2; do
  arm "def_$round" TWINSTEP_UNUSED=1
  arm "attn_$round" TWINSTEP_QKV_WRITE=attention
  arm "cap16_$round" TWINSTEP_DECODE_SPLITS_MAX=16
  arm "attn_cap16_$round" TWINSTEP_QKV_WRITE=attention TWINSTEP_DECODE_SPLITS_MAX=16
done
TWINSTEP_QKV_WRITE=attention TWINSTEP_BENCH_QUICK=1 TWINSTEP_BENCH_TRACE=1 part trace 60 \
  "$BIN/engine_throughput_bench" --decode
awk '/^-- trace: decode b=1, graphs/{on=1} /^-- trace: decode b=1, eager/{on=0} on' \
  "$OUT/trace.log" | head -24
# The forward with the folded write: the model gates (HF greedy parity, teacher-forced logits,
# paged vs oracle) and the decode graph gates under TWINSTEP_QKV_WRITE=attention (~200 s).
TWINSTEP_QKV_WRITE=attention timeout 240 ctest --preset gpu-gates -R "ModelGates|DecodeGraphGates" \
  > "$OUT/ctest_attn.log" 2>&1
echo "ctest (attention write): exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\[gate\] (g12b|gsoft)" "$OUT/ctest_attn.log" | head -12
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
