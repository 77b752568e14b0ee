#!/usr/bin/env bash
# perf/gpu_prefill_run.sh: one device call for the attention work (issues 12 and 13): build the
# gpu-gates preset, the new attention gates first, the attention benches (ours and PyTorch SDPA
# on the same shapes), the engine throughput bench, then every gate. Logs under $OUT.
# GATES=0 skips the full gate run; ENGINE=0 skips the engine bench.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
cmake --preset gpu-gates > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build --preset gpu-gates -j16 > "$OUT/build.log" 2>&1 ||
  { grep -m 30 -E "error" "$OUT/build.log"; exit 1; }
bin=./build/gpu-gates/bin
for g in ${ATTN_GATES:-prefill_tc_gates prefill_tc_trap_gate}; do
  timeout 300 $bin/$g 2>&1 | grep -E "\[gate\]|OK|FAILED|PASSED|Failure|error|expected|Which is" |
    tee -a "$OUT/attn_gates.log"
done
for b in ${BENCHES:-prefill_attention_bench}; do
  echo "== $b" | tee -a "$OUT/bench.log"
  timeout 300 $bin/$b 2>&1 | tee -a "$OUT/bench.log"
done
if [ "${SDPA:-1}" = 1 ]; then
  echo "== sdpa" | tee -a "$OUT/bench.log"
  PYTHONUNBUFFERED=1 timeout 200 python3 gates/hf/sdpa_bench.py 2>&1 | tee -a "$OUT/bench.log"
fi
if [ "${ENGINE:-1}" = 1 ]; then
  echo "== engine" | tee "$OUT/engine.log"
  timeout 300 $bin/engine_throughput_bench 2>&1 | tee -a "$OUT/engine.log"
fi
rc=0
if [ "${GATES:-1}" = 1 ]; then
  ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "^ *[0-9]+/[0-9]+ Test|tests passed|tests failed" "$OUT/ctest.log"
fi
exit $rc
