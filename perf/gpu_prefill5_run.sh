#!/usr/bin/env bash
# perf/gpu_prefill5_run.sh: the device call of issue 12's session-5 cuDNN work ("cuDNN local
# prefill on by default"): gates and benches built here (build/h-cudnn-eng, gpu-gates
# variables) and carried stripped, as .prefill-carry/bins.tgz (bin/...); the model gates find their build dir
# (hf_refs, twinstep-generate) at the path compiled into them. Logs under $OUT (<= 8 files).
#   PARTS: which parts run, in this order (default all): cudnn bw bench model others
#   CUDNN: the TWINSTEP_CUDNN_PREFILL the gates run with (default 1; "" leaves it unset, so
#          the bench's off/on devices are what they say). KEYS=1: the bench's plan-key costs.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
build=/work/main/build/h-cudnn-eng  # TWINSTEP_BINARY_DIR of the carried model gates
[ -f .prefill-carry/bins.tgz ] && tar -xzf .prefill-carry/bins.tgz -C .prefill-carry
link_build_bin "$build" "$PWD/.prefill-carry/bin"
pwd; ls "$build/bin/" | tr '\n' ' '; echo
bin=$build/bin
ldd "$bin/prefill_cudnn_gates" | grep -E "cudnn|not found"
if [ -n "${CUDNN-1}" ]; then export TWINSTEP_CUDNN_PREFILL=${CUDNN-1}; fi
t "TWINSTEP_CUDNN_PREFILL=${TWINSTEP_CUDNN_PREFILL:-unset}"
for part in ${PARTS:-cudnn bw bench model others}; do
  case $part in
  cudnn)
    timeout 90 "$bin/prefill_cudnn_gates" > "$OUT/cudnn_gates.log" 2>&1
    t "prefill_cudnn_gates rc $?"
    summary "$OUT/cudnn_gates.log"
    ;;
  bench)
    env ${KEYS:+TWINSTEP_BENCH_CUDNN_KEYS=1} timeout 150 "$bin/engine_throughput_bench" \
      --cudnn-prefill > "$OUT/bench.log" 2>&1
    t "engine_throughput_bench --cudnn-prefill rc $?"
    cut -c1-400 "$OUT/bench.log" | tail -60
    ;;
  model)
    timeout 240 "$bin/model_gates" > "$OUT/model_gates.log" 2>&1
    t "model_gates rc $?"
    LINES_MAX=80 summary "$OUT/model_gates.log"
    ;;
  others)
    for g in decode_graph_gates prefix_cache_gates logprob_gates; do
      [ -x "$bin/$g" ] || continue  # not carried this call
      timeout 120 "$bin/$g" > "$OUT/$g.log" 2>&1
      t "$g rc $?"
      LINES_MAX=30 summary "$OUT/$g.log"
    done
    ;;
  kernel)
    timeout 60 "$bin/kernel_gates" > "$OUT/kernel_gates.log" 2>&1
    t "kernel_gates rc $?"
    LINES_MAX=30 summary "$OUT/kernel_gates.log"
    ;;
  bw)
    timeout 60 "$bin/kernel_bandwidth_bench" > "$OUT/bw.log" 2>&1
    t "kernel_bandwidth_bench rc $?"
    cat "$OUT/bw.log"
    ;;
  esac
done
t "done"
