#!/usr/bin/env bash
# perf/gpu_closing_bench.sh: the benches of a session's closing device call, on the binaries
# perf/gpu_closing_run.sh just built (run it in the next call while the machine is warm; it
# builds nothing). Default engine bench (prefill with the defaults, decode with graphs, the long
# context and prefix-cache sections), then the batch-invariant mode's decode and prefill, each
# under its own time limit so one cannot starve the others. Logs under $OUT (bench_*.log).
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BIN=${BIN:-build/gpu-gates/bin}
py_cudnn=$(python3 -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null)
export LD_LIBRARY_PATH="${py_cudnn:+$py_cudnn/lib:}${LD_LIBRARY_PATH}"
run() {  # run NAME LIMIT ARGS...: one bench, its table lines on stdout
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$BIN/engine_throughput_bench" "$@" > "$OUT/bench_$name.log" 2>&1
  echo "== $name (engine_throughput_bench $*): exit $?, $(($(date +%s) - t0)) s"
  grep -E "^\| (prefill|decode)|cuDNN|ratio|invariant|host path|floor" "$OUT/bench_$name.log" | head -40
}
# DECODE_ARMS (default none): extra decode-only runs of the same binary for a same-machine A/B,
# each engine_throughput_bench --decode with TWINSTEP_BENCH_QUICK=1: off (the defaults), stream
# (TWINSTEP_SKINNY=16: the streamed few-row GEMM + PDL), chain (that and TWINSTEP_DECODE_PDL=1),
# pdl (TWINSTEP_DECODE_PDL=1 with the default GEMMs), chain256 (chain with TWINSTEP_SKINNY=16,k256).
arm() {  # arm NAME: one decode A/B arm, its per-batch medians on stdout
  local name=$1
  run "decode_$name" "${LIMIT_ARM:-40}" --decode > /dev/null
  echo "== decode arm $name: $(grep -cE 'median .* ms/step' "$OUT/bench_decode_$name.log") medians"
  grep -E "== decode batch|median .* ms/step" "$OUT/bench_decode_$name.log" | head -24
}
for a in ${DECODE_ARMS:-}; do
  case $a in
    off) TWINSTEP_BENCH_QUICK=1 arm off ;;
    stream) TWINSTEP_SKINNY=16 TWINSTEP_BENCH_QUICK=1 arm stream ;;
    chain) TWINSTEP_SKINNY=16 TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 arm chain ;;
    pdl) TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 arm pdl ;;
    chain256) TWINSTEP_SKINNY=16,k256 TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 arm chain256 ;;
  esac
done
run default "${LIMIT_DEFAULT:-150}"
run invariant_decode "${LIMIT_INV_DECODE:-90}" --decode-batch-invariant
run invariant_prefill "${LIMIT_INV_PREFILL:-120}" --batch-invariant
