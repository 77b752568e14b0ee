#!/usr/bin/env bash
# perf/gpu_s20_decode.sh (written in session 19 for the next session's first call, ~250 s on
# an H200): issue 13's b=1 step (7.33-7.39 ms against <= 7.3 in session 19). Two candidates,
# both opt-in, neither yet run on a GPU:
#   TWINSTEP_QKV_WRITE=attention  the q/k/v write folded into the split attention
#                                 (attention_decode_split_write; one launch less a layer)
#   TWINSTEP_DECODE_SPLITS_MAX=N  the split count capped (b=1: local 33 splits, global 132)
# The split gates first (the new FusedQkvWriteEqualsWriteThenAttention among them, and the
# numeric ones under a cap), the kernel alone at each cap, then the engine's quick decode with
# and without the folded write, one process an arm, three rounds in turns. (The model gates
# under the folded write run in the closing call: the write gate above is bitwise, so they see
# the same bits.)
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
# Three rounds of the two arms in turns (the cap has its kernel rows above; the engine arms
# are the write's A/B, which decides the default).
for round in 1 2 3; do
  arm "def_$round" TWINSTEP_UNUSED=1
  arm "attn_$round" TWINSTEP_QKV_WRITE=attention
done
# b=1 ms/step of each arm's three processes, and the verdict the default follows.
python3 - "$OUT" <<'PY'
import re, sys, glob, statistics
out = sys.argv[1]
ms = {}
for arm in ("def", "attn"):
    for f in sorted(glob.glob(f"{out}/dec_{arm}_*.log")):
        for line in open(f):
            m = re.match(r"\| decode b=1 +\| +[0-9]+ +\| +([0-9.]+)", line)
            if m:
                ms.setdefault(arm, []).append(float(m.group(1)))
                break
print("b=1 ms/step:", ms)
if len(ms.get("def", [])) == 3 and len(ms.get("attn", [])) == 3:
    d, a = statistics.median(ms["def"]), statistics.median(ms["attn"])
    print(f"b=1 median: default {d:.3f}, attention write {a:.3f}, "
          f"{'attention wins' if max(ms['attn']) < min(ms['def']) else 'no clear win'}")
PY
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
