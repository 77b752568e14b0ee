#!/usr/bin/env bash
# perf/gpu_s15_cluster_run.sh (session 15, issue 12): the head_dim 512 prefill attention in
# clusters of two blocks (kWgmmaSplitDimsCluster / ...KeyTile32,
# attention_prefill_wgmma512_cluster.cu): prefill_tc_gates (every variant against the
# reference at the measured bound), the attention-only bench (every hd512 variant, the peak and
# SDPA in the same process), then, if the gates passed, the engine's prefill step one process an
# arm in turns, two rounds: TWINSTEP_PREFILL_512=split (the one-block kernel), cluster (ARMS
# overrides the list).
# Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates prefill_tc_gates prefill_attention_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 150 "$BIN/prefill_tc_gates"
gates_rc=$(grep -c "FAILED" "$OUT/gates.log")
grep -E "hd 512|clusters|pipelined vs|FAILED|OK \]|rror|xpected|Which|Value" "$OUT/gates.log" | cut -c1-240 | head -60
t gates done
part attn_bench 200 "$BIN/prefill_attention_bench"
grep -E -i "device|hd512|512|cluster|split|peak|sdpa" "$OUT/attn_bench.log" | head -60
t bench done
[ "$gates_rc" = 0 ] || { echo "gates failed: no engine arms"; exit 1; }
for round in 1 2; do
  for arm in ${ARMS:-split cluster}; do
    part "prefill_${round}_$arm" 100 env TWINSTEP_PREFILL_512=$arm "$BIN/engine_throughput_bench" --prefill
    echo "$arm: $(grep -E "^\| prefill 16x2048" "$OUT/prefill_${round}_$arm.log" | cut -c1-70)"
    grep -E "^  attention |each step" "$OUT/prefill_${round}_$arm.log" | head -2
  done
done
t done
