# perf/gpu_env.sh: the set-up the device scripts share (gpu_*_run.sh), sourced from them as
#   . "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
# It sets pipefail, makes $OUT (default /tmp/out), puts the cuDNN and NCCL of the runner's
# python (nvidia.cudnn, nvidia.nccl) first on LD_LIBRARY_PATH where there are, and defines:
#   t MSG                  MSG after the seconds since the sourcing ($start)
#   part NAME LIMIT BIN ARGS...  BIN ARGS under `timeout LIMIT`, output to $OUT/NAME.log, then
#                          one line "== NAME (BIN ARGS): exit RC, S s"
#   summary LOG            the gate lines and verdicts of a gtest log: SUMMARY_MORE adds
#                          patterns (an ERE alternative), SUMMARY_CUT the line width (420),
#                          LINES_MAX the lines (60)
#   build_gates [TARGET...]  configure the gpu-gates preset and build TARGETs (all without
#                          any) with 16 jobs, log in /tmp/build.log; on failure its first
#                          errors and exit 1
#   build_keep_going [TARGET...]  as build_gates, but every target that compiles is built (-k 0:
#                          a gate that does not compile fails alone in ctest); errors printed,
#                          no exit
#   card_setup             the card's name, driver, clock and power limit; on a card under
#                          100 GB, TWINSTEP_BENCH_DECODE_MAX_BATCH=64 (the pools an H100 holds)
#   decode_arms NAME:SKINNY...  the quick decode bench once an arm, in the order given (one
#                          process an arm), TWINSTEP_SKINNY=SKINNY (empty: unset, the defaults),
#                          log $OUT/dec_NAME.log, its decode lines printed
#   qkv_arm NAME ARM [LIMIT]  the quick decode bench (one process) with TWINSTEP_QKV_WRITE unset
#                          (ARM def) or "attention" (ARM attn, the folded write), log
#                          $OUT/NAME.log, under timeout LIMIT (90 s)
#   apply_decision         where build/gpu-gates/s22_decision says "fold" (perf/gpu_s22_h200.sh),
#                          perf/s22_qkv_write_default.patch applied to this tree unless it is in
#                          it already (the fold as the forward's default)
#   link_build_bin BUILD BINDIR  BUILD/bin (the build dir compiled into the carried model gates)
#                          made a link to the carried BINDIR, /work/main linked to this tree
#                          where the gates' sources are not there
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$(date +%s)
t() { echo "[$(($(date +%s) - start)) s] $*"; }
py_cudnn=$(python3 -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null)
py_nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)
export LD_LIBRARY_PATH="${py_cudnn:+$py_cudnn/lib:}${py_nccl:+$py_nccl/lib:}${LD_LIBRARY_PATH}"
part() {  # part NAME LIMIT BINARY ARGS...
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name ($*): exit $?, $(($(date +%s) - t0)) s"
}
summary() {  # summary LOG: the gate lines and verdicts of a gtest log
  grep -E "\[gate\]|${SUMMARY_MORE:+$SUMMARY_MORE|}OK \]|FAILED|Failure|xpected|Which is|Value of|rror:|passed|failed" "$1" |
    grep -v "Google Test trace" | cut -c1-${SUMMARY_CUT:-420} | head -${LINES_MAX:-60}
}
qkv_arm() {  # qkv_arm NAME ARM [LIMIT]
  local v=""
  [ "$2" = attn ] && v=attention
  TWINSTEP_QKV_WRITE=$v TWINSTEP_BENCH_QUICK=1 part "$1" "${3:-90}" \
    build/gpu-gates/bin/engine_throughput_bench --decode
}
apply_decision() {
  local p=perf/s22_qkv_write_default.patch
  [ "$(cat build/gpu-gates/s22_decision 2>/dev/null)" = fold ] || return 0
  if patch -p1 -N -s --dry-run < $p > /dev/null 2>&1; then
    patch -p1 -N -s < $p && echo "applied $p (the fold as the default)"
  else
    echo "$p: in this tree already"
  fi
}
link_build_bin() {  # link_build_bin BUILD BINDIR
  if [ ! -e /work/main/gates/hf/make_refs.py ]; then
    mkdir -p /work && ln -sfn "$PWD" /work/main
  fi
  mkdir -p "$1"
  rm -rf "$1/bin" && ln -sfn "$2" "$1/bin"
}
build_gates() {  # build_gates [TARGET...]
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  { cmake --preset gpu-gates && cmake --build build/gpu-gates -j16 "${targets[@]}"; } \
    > /tmp/build.log 2>&1 || { grep -m 30 -E "error|Error" /tmp/build.log; exit 1; }
}
build_keep_going() {  # build_keep_going [TARGET...]: every target that compiles (-k 0); errors shown
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  { cmake --preset gpu-gates && cmake --build build/gpu-gates -j16 "${targets[@]}" -- -k 0; } \
    > /tmp/build.log 2>&1 || grep -m 20 -E "error" /tmp/build.log
}
card_setup() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "${mib:-0}" -lt 100000 ]; then export TWINSTEP_BENCH_DECODE_MAX_BATCH=64; fi
}
decode_arms() {  # decode_arms NAME:SKINNY...
  local arm value
  for arm in "$@"; do
    value=${arm#*:}  # empty: the defaults ("" would be a Blas::create error)
    if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
    TWINSTEP_BENCH_QUICK=1 part "dec_${arm%%:*}" 100 build/gpu-gates/bin/engine_throughput_bench \
      --decode
    grep -E "^\| decode" "$OUT/dec_${arm%%:*}.log"
  done
  unset TWINSTEP_SKINNY
}
