#!/usr/bin/env bash
# perf/gpu_cudnn_run.sh: one device call for issue 12 item 3 (cuDNN's paged SDPA forward): the
# CMake lookup on the runner (configure only), then the cuDNN gate (with cuDNN's own error log)
# and the prefill attention bench. Uses binaries carried in build/h-cudnn/bin when they load
# there (LD_LIBRARY_PATH gets PyTorch's cuDNN), else builds them there. Logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
py_cudnn=$(python3 -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null)
echo "python nvidia.cudnn: ${py_cudnn:-none}; lib: $(ls "$py_cudnn/lib" 2>/dev/null | tr '\n' ' ')"
ls /usr/local/cuda/include/cudnn_graph.h /usr/local/cuda/lib64/libcudnn_graph.so.9 2>&1 | head -2
# The lookup, as CI and the gpu-gates preset run it.
timeout 120 cmake --preset gpu-gates -B build/h-cudnn-dev > "$OUT/configure.log" 2>&1
grep -E "cuDNN|CUDA=" "$OUT/configure.log"
bin=build/h-cudnn/bin
export LD_LIBRARY_PATH="${py_cudnn:+$py_cudnn/lib:}${LD_LIBRARY_PATH}"
if [ "${FORCE_BUILD:-0}" = 1 ] || ! "$bin/prefill_cudnn_gates" --gtest_list_tests > /dev/null 2>&1 ||
   ldd "$bin/prefill_attention_bench" | grep -q "not found"; then
  echo "carried binaries do not load here (or FORCE_BUILD): building"
  bin=build/h-cudnn-dev/bin
  timeout 420 cmake --build build/h-cudnn-dev -j16 --target prefill_cudnn_gates \
    prefill_attention_bench > "$OUT/build.log" 2>&1 || grep -m 20 error "$OUT/build.log"
fi
ldd "$bin/prefill_cudnn_gates" | grep -E "cudnn|not found"
gate() {  # gate [ENV=VALUE...]: one run of the cuDNN gate, its summary lines
  env "$@" CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$OUT/cudnn_log_full.txt" timeout 200 \
    "$bin/prefill_cudnn_gates" > "$OUT/gate_run.log" 2>&1
  local rc=$?
  echo "== gate $* rc $rc"
  grep -E "\[gate\]|OK \]|FAILED \]|Failure|rror|xpected|Which is|Value of|message" \
    "$OUT/gate_run.log" | grep -v "Google Test trace" | cut -c1-500 | head -${LINES_MAX:-40}
  cat "$OUT/gate_run.log" >> "$OUT/gate.log"
  return $rc
}
sanitize() {
  env "$@" timeout 150 "${SANITIZER:-compute-sanitizer}" --tool memcheck --print-limit 3 \
    "$bin/prefill_cudnn_gates" --gtest_filter='*Matches*' > "$OUT/sanitizer_run.log" 2>&1
  echo "== sanitizer $* rc $?"
  grep -E "Invalid|bytes|Address|at .*0x|Saved host|====" "$OUT/sanitizer_run.log" | head -30
  cat "$OUT/sanitizer_run.log" >> "$OUT/sanitizer.log"
}
command -v compute-sanitizer > /dev/null || SANITIZER=/usr/local/cuda/bin/compute-sanitizer
gate TWINSTEP_CUDNN_GATE_RAGGED_BITS=64
ok=$?
if [ $ok != 0 ]; then
  LINES_MAX=12 gate TWINSTEP_CUDNN_GATE_RAGGED_BITS=32 TWINSTEP_CUDNN_GATE_CASES=2
  LINES_MAX=12 gate TWINSTEP_CUDNN_GATE_RAGGED_BITS=64 TWINSTEP_CUDNN_GATE_EXACT=1 TWINSTEP_CUDNN_GATE_CASES=2
  sanitize TWINSTEP_CUDNN_GATE_RAGGED_BITS=64 TWINSTEP_CUDNN_GATE_CASES=1
fi
head -c 3000000 "$OUT/cudnn_log_full.txt" > "$OUT/cudnn_log.txt" 2>/dev/null
rm -f "$OUT/cudnn_log_full.txt"
if [ "${BENCH:-1}" = 1 ]; then
  timeout 240 "$bin/prefill_attention_bench" > "$OUT/bench.log" 2>&1
  echo "bench rc $?"
  cut -c1-400 "$OUT/bench.log" | tail -45
fi
[ "${SANITIZE_EXACT:-1}" = 1 ] &&
  sanitize TWINSTEP_CUDNN_GATE_RAGGED_BITS=${EXACT_BITS:-64} TWINSTEP_CUDNN_GATE_EXACT=1 TWINSTEP_CUDNN_GATE_CASES=1
