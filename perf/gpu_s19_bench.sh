#!/usr/bin/env bash
# perf/gpu_s19_bench.sh (written in session 18): the benches of the closing runs, after
# perf/gpu_s19_gates.sh on the same machine (builds only what is missing): the engine's decode
# table (full, with the 32k case, the graph memory and the floor), the kernel-only split-KV
# decode bench, the engine's prefill (each step) beside an nvidia-smi log, the attention-only
# prefill bench.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates engine_throughput_bench decode_attention_bench prefill_attention_bench
t built
BIN=build/gpu-gates/bin
part decode 150 "$BIN/engine_throughput_bench" --decode
grep -E "^\| decode|^decode graphs|^pools:|floor|long|host path" "$OUT/decode.log" | head -40
part dec_kernel 120 "$BIN/decode_attention_bench" --no-reference
grep -E "^device|copy|^\| " "$OUT/dec_kernel.log" | head -30
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
TWINSTEP_BENCH_PREFILL_OBSERVE=1 part prefill 90 "$BIN/engine_throughput_bench" --prefill
kill $smi
grep -E "steps, |each step|^\| prefill|OBSERVED" "$OUT/prefill.log"
part attn_bench 60 "$BIN/prefill_attention_bench"
grep -E "^device|^\| (local|global)" "$OUT/attn_bench.log"
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log smi.csv && rm -f ./*.log smi.csv
