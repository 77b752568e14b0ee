#!/usr/bin/env bash
# perf/gpu_s20_close_decode.sh (session 20, issue 13, for a device budget that has room for two
# calls only): the split gates (the folded write's bitwise gate among them), then the engine's
# FULL decode bench twice, the defaults and TWINSTEP_QKV_WRITE=attention (the folded write),
# one process each (each is the A/B's sample and, for the winner, the closing table: b=1..128,
# b=16 at 32k, graph memory, host path), then the kernel-only split-KV bench. The gates follow
# in a second call (perf/gpu_s19_gates.sh) under the winner.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates engine_throughput_bench decode_split_gates decode_attention_bench
t built
BIN=build/gpu-gates/bin
part gates 120 "$BIN/decode_split_gates"
summary "$OUT/gates.log" | grep -E "FusedQkvWrite|OK \]|FAILED|rror" | cut -c1-200 | tail -14
for arm in def attn; do
  v=""
  [ $arm = attn ] && v=attention
  TWINSTEP_QKV_WRITE=$v part "decode_$arm" 170 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode|^decode graphs|^pools:|host path" "$OUT/decode_$arm.log" | head -24
done
part dec_kernel 100 "$BIN/decode_attention_bench" --no-reference
grep -E "^device|copy|^\| " "$OUT/dec_kernel.log" | head -30
t done
cd "$OUT" && tar czf decode_logs.tgz ./*.log && rm -f ./*.log
