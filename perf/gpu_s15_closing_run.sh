#!/usr/bin/env bash
# perf/gpu_s15_closing_run.sh (session 15): the tree as committed, built once: every gate
# (ctest --preset gpu-gates), then the engine's prefill (defaults, each step's time), the
# attention-only bench (every family, the peak and PyTorch's SDPA... as the bench prints) and the
# engine's decode table. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-440}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t ctest done
BIN=build/gpu-gates/bin
part prefill 60 "$BIN/engine_throughput_bench" --prefill
grep -E "steps, |each step|^\| prefill|^  attention|forward \(GPU" "$OUT/prefill.log"
part attn_bench 60 "$BIN/prefill_attention_bench"
grep -E "^device|^\| (local|global)" "$OUT/attn_bench.log"
part decode 90 "$BIN/engine_throughput_bench" --decode
grep -E "^\| decode|graph memory|decode graphs:" "$OUT/decode.log" | head -12
t done
