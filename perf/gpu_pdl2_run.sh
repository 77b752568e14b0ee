#!/usr/bin/env bash
# perf/gpu_pdl2_run.sh: programmatic decode, second step (issue 13, session 8): the fused q/k/v
# write launched programmatically and the split kernel copying its older keys before its wait.
# Builds the gpu-gates preset here (on the runner), then parts, each under its own limit, logs
# under $OUT:
#   split / trap / graph   decode_split_gates, decode_split_trap_gate, decode_graph_gates'
#                          StreamedFewRowGemmAndProgrammaticDecodeMatchPlainBitwise
#   kbench                 decode_attention_bench --no-reference
#   off / pdl / chain / chain256  engine_throughput_bench --decode (TWINSTEP_BENCH_QUICK), the
#                          same binary: defaults; TWINSTEP_DECODE_PDL=1 (cuBLAS GEMMs); that with
#                          TWINSTEP_SKINNY=16 (streamed few-row GEMM); with TWINSTEP_SKINNY=16,k256
#   overlap                perf/probes/overlap_probe.py (prefill: two streams of row halves)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
{ cmake --preset gpu-gates && cmake --build --preset gpu-gates -j16; } > /tmp/build.log 2>&1 ||
  { grep -m 30 -E "error|Error" /tmp/build.log; cp /tmp/build.log "$OUT"; exit 1; }
t built
BIN=build/gpu-gates/bin
for p in ${PARTS:-split trap graph kbench off pdl chain256 overlap}; do
  case $p in
    split) part split_gates "${LIMIT_GATES:-60}" "$BIN/decode_split_gates" ;;
    trap) part trap_gate 15 "$BIN/decode_split_trap_gate" ;;
    graph) part graph_gates "${LIMIT_GRAPH:-60}" "$BIN/decode_graph_gates" \
      --gtest_filter='*StreamedFewRowGemm*' ;;
    kbench) part kbench "${LIMIT_KBENCH:-25}" "$BIN/decode_attention_bench" --no-reference ;;
    off) (unset TWINSTEP_SKINNY TWINSTEP_DECODE_PDL; TWINSTEP_BENCH_QUICK=1 part engine_off \
      "${LIMIT_ENGINE:-30}" "$BIN/engine_throughput_bench" --decode) ;;
    pdl) TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 part engine_pdl \
      "${LIMIT_ENGINE:-30}" "$BIN/engine_throughput_bench" --decode ;;
    chain) TWINSTEP_SKINNY=16 TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 part engine_chain \
      "${LIMIT_ENGINE:-30}" "$BIN/engine_throughput_bench" --decode ;;
    overlap) part overlap "${LIMIT_OVERLAP:-90}" python3 perf/probes/overlap_probe.py ;;
    chain256) TWINSTEP_SKINNY=16,k256 TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 \
      part engine_chain256 "${LIMIT_ENGINE:-30}" "$BIN/engine_throughput_bench" --decode ;;
  esac
done
for f in "$OUT"/*_gates.log "$OUT"/trap_gate.log; do
  [ -e "$f" ] && { echo "---- $f"; summary "$f"; }
done
[ -e "$OUT/overlap.log" ] && { echo "---- overlap"; cat "$OUT/overlap.log"; }
for f in "$OUT"/kbench.log "$OUT"/engine_*.log; do
  [ -e "$f" ] || continue
  echo "---- $f"
  grep -E "^cudaMemcpy|^copy|^ *(1|16|64|128) +[0-9]+ |^local|^global|median .* ms/step|graphs: |error|rror" "$f" | cut -c1-300 | head -40
done
