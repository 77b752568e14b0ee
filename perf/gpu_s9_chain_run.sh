#!/usr/bin/env bash
# perf/gpu_s9_chain_run.sh (session 9, call 4; issue 13): the short kernels' latency chain.
# Weights, plan arrays and rope tables before griddepcontrol.wait (q/k/v write, residual norm),
# the merge's loads in batches, the cluster argmax. Full gpu-gates build; the gates of the
# kernels touched; engine_throughput_bench quick (prefill + decode, traced); --decode with
# TWINSTEP_DECODE_MERGE=sized beside it.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates
t built
BIN=build/gpu-gates/bin
part kgates 120 "$BIN/kernel_gates"
part split 120 "$BIN/decode_split_gates"
part graphs 200 "$BIN/decode_graph_gates"
for f in kgates split graphs; do SUMMARY_CUT=300 LINES_MAX=40 summary "$OUT/$f.log" | grep -v "OK \]"; grep -cE "OK \]" "$OUT/$f.log"; done
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part bench "${LIMIT_BENCH:-200}" "$BIN/engine_throughput_bench"
for b in 1 16; do sed -n "/trace: decode b=$b, graphs/,/gap/p" "$OUT/bench.log" | cut -c1-150 | head -24; done
grep -A14 "phase breakdown: prefill" "$OUT/bench.log"
grep -E "^\| |graphs: .* ms/step" "$OUT/bench.log"
TWINSTEP_DECODE_MERGE=sized TWINSTEP_BENCH_QUICK=1 part sized 150 "$BIN/engine_throughput_bench" --decode
grep -E "^\| decode|graphs: .* ms/step" "$OUT/sized.log"
t done
