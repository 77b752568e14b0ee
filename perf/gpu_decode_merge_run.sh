#!/usr/bin/env bash
# perf/gpu_decode_merge_run.sh: the split-KV decode's fused merge (issue 13, session 6) on the
# binaries built here and carried (BIN). Parts, each under its own time limit, logs under $OUT:
#   bench    decode_attention_bench --no-reference (two-kernel vs fused per case, one process)
#   split / trap / graph  decode_split_gates, decode_split_trap_gate, decode_graph_gates
#   engine_sized / engine_2k / engine_fused  engine_throughput_bench --decode (section 2 only,
#            TWINSTEP_BENCH_QUICK) with TWINSTEP_DECODE_MERGE=sized, =two-kernel (the default),
#            =fused; the same binary, one process each.
# Session 6's one call ran this with parts named engine_auto (TWINSTEP_DECODE_MERGE unset, when
# unset still meant the size rule: today's "sized") and engine_2k, and a 25 s limit on the split
# gates that cut FusedMergeMatchesTwoKernelBitwise (the first two tests took 21.5 s): 60 s now.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
BIN=${BIN:-build/h-decode/bin}
for p in ${PARTS:-bench split trap engine_sized engine_2k graph}; do
  case $p in
    bench) part bench "${LIMIT_BENCH:-20}" "$BIN/decode_attention_bench" --no-reference ;;
    split) part split_gates "${LIMIT_GATES:-60}" "$BIN/decode_split_gates" ;;
    trap) part trap_gate 10 "$BIN/decode_split_trap_gate" ;;
    graph) part graph_gates "${LIMIT_GRAPH:-25}" "$BIN/decode_graph_gates" ;;
    engine_sized) TWINSTEP_DECODE_MERGE=sized TWINSTEP_BENCH_QUICK=1 part engine_sized \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_2k) TWINSTEP_DECODE_MERGE=two-kernel TWINSTEP_BENCH_QUICK=1 part engine_2k \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_fused) TWINSTEP_DECODE_MERGE=fused TWINSTEP_BENCH_QUICK=1 part engine_fused \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
  esac
done
for f in "$OUT"/*.log; do
  echo "---- $f"
  grep -E "^cudaMemcpy|^ *(1|16|64|128) +[0-9]+ |^local|^global|median .* ms/step|graphs: |phase breakdown|attention|forward \(GPU|PASSED|FAILED|OK \]|Failure|error|expected|trap" "$f" | head -60
done
