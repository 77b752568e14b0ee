#!/usr/bin/env bash
# perf/gpu_s22_h200.sh (session 22, issue 13 on an H200): the folded q/k/v write decided and the
# closing decode figures taken in ONE call, the gates left to perf/gpu_s22_gates.sh on the same
# warm machine (it reads the decision this call leaves in the build folder).
#   1. every gpu-gates target built (the next call's gates need them; -k 0);
#   2. the split-KV gates (the folded write's bitwise gate among them);
#   3. the quick decode bench, one process an arm, defaults then TWINSTEP_QKV_WRITE=attention;
#      a second round when the b=1 arms are within 0.05 ms of each other. The fold wins when its
#      b=1 mean is lower by >= 0.02 ms and no batch of 16, 64 or 128 is slower by more than 1%;
#   4. on a win, perf/s22_qkv_write_default.patch (the fold as the default, "unfolded" the
#      opt-out) applied to this tree and the forward rebuilt: the closing figures then run the
#      tree that will be committed;
#   5. the kernel-only split-KV bench and the FULL decode bench of the tree as it now stands (the
#      closing table: b=1..128, b=16 at 32k, the graph memory, the host path).
# The decision goes to build/gpu-gates/s22_decision ("fold" or "unfolded").
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_keep_going
t built
BIN=build/gpu-gates/bin
left() { echo $((${END_S:-575} - ($(date +%s) - start))); }
part gates 100 "$BIN/decode_split_gates"
summary "$OUT/gates.log" | grep -E "FusedQkvWrite|OK \]|FAILED|rror" | cut -c1-200 | tail -14
b_ms() {  # b_ms LOG BATCH: the ms/step of "decode b=BATCH"
  grep -E "^\| decode b=$2 " "$1" | head -1 | awk -F'|' '{gsub(/ /, "", $4); print $4}'
}
declare -A sum
rounds=0
for round in 1 2; do
  for arm in def attn; do
    qkv_arm "q_${arm}_$round" $arm
    line=""
    for b in 1 16 64 128; do
      ms=$(b_ms "$OUT/q_${arm}_$round.log" $b)
      sum[$arm$b]=$(python3 -c "print(${sum[$arm$b]:-0} + ${ms:-1e9})")
      line="$line b=$b ${ms:-?}"
    done
    echo "$arm round $round:$line"
  done
  rounds=$round
  close=$(python3 -c "print(abs(${sum[def1]} - ${sum[attn1]}) / $round < 0.05)")
  [ "$close" = True ] && [ "$(left)" -gt 380 ] || break
done
verdict=$(python3 - "$rounds" <<PY
import sys
n = int(sys.argv[1])
d1, a1 = ${sum[def1]} / n, ${sum[attn1]} / n
worse = [b for b, dd, aa in ((16, ${sum[def16]}, ${sum[attn16]}), (64, ${sum[def64]}, ${sum[attn64]}),
                             (128, ${sum[def128]}, ${sum[attn128]})) if aa > dd * 1.01]
print("fold" if a1 <= d1 - 0.02 and not worse else "unfolded",
      f"(b=1 defaults {d1:.3f} ms, folded {a1:.3f}; slower by > 1% at {worse or 'none'})")
PY
)
echo "decision: $verdict"
echo "${verdict%% *}" > build/gpu-gates/s22_decision
if [ "${verdict%% *}" = fold ]; then
  apply_decision
  build_keep_going
  t rebuilt
fi
part dec_kernel "$(( $(left) < 100 ? $(left) : 100 ))" "$BIN/decode_attention_bench" --no-reference
grep -E "^device|copy|^\| " "$OUT/dec_kernel.log" | head -30
part decode_full "$(( $(left) - 5 ))" "$BIN/engine_throughput_bench" --decode
grep -E "^\| decode|^decode graphs|^pools:|graph|host path" "$OUT/decode_full.log" | head -30
t done
cd "$OUT" && tar czf decode_logs.tgz ./*.log && rm -f ./*.log
