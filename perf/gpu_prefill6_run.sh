#!/usr/bin/env bash
# perf/gpu_prefill6_run.sh: a device call of issue 12's session-6 work (the fused q norm + rope +
# KV write, the prefetching residual_norm, the prefill step's host path): binaries built here
# (build/h-prefill, gpu-gates variables), carried stripped as .prefill-carry/bins.tgz (bin/...);
# the model gates find their build dir (hf_refs, twinstep-generate) at the path compiled into
# them. Logs under $OUT (<= 8 files).
#   PARTS: which parts run, in this order (default: bw kernel trap engine model graphs)
#   (Call 2 of session 6 ran `bw kernel trap pick engine model graphs ncu` on d7a6e1c, where a
#   "pick" part set TWINSTEP_QKV_WRITE_SPLIT_ROWS=1024 when the bench's fused kernel lost at
#   8192 rows; the forward's rule is fixed since, kFusedQkvWriteMaxRows in model_forward.cc.)
#   ENGINE_ARGS: engine_throughput_bench's argument (default none); QUICK=1 (default): its
#   sections 1 (prefill, phases, host path) and 2 (decode) only (TWINSTEP_BENCH_QUICK)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
build=/work/main/build/h-prefill  # TWINSTEP_BINARY_DIR of the carried model gates
[ -f .prefill-carry/bins.tgz ] && tar -xzf .prefill-carry/bins.tgz -C .prefill-carry
link_build_bin "$build" "$PWD/.prefill-carry/bin"
bin=$build/bin
ls "$bin/" | tr '\n' ' '; echo
SUMMARY_MORE='\[model gate'  # summary (gpu_env.sh): the model gates' lines too
for part in ${PARTS:-bw kernel trap engine model graphs}; do
  case $part in
  bw)
    timeout 60 "$bin/kernel_bandwidth_bench" > "$OUT/bw.log" 2>&1
    t "kernel_bandwidth_bench rc $?"
    cat "$OUT/bw.log"
    ;;
  ncu)  # every kernel of interest of the bandwidth bench, each launched twice (profile mode)
    ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    left=$((${BUDGET_S:-140} - $(date +%s) + start))
    [ "$left" -lt 12 ] && { t "ncu skipped: ${left} s left"; continue; }
    TWINSTEP_BW_PROFILE=1 timeout "$left" "$ncu_bin" --clock-control none \
      -k regex:"${NCU_K:-qkv_write|kv_write_kernel|qk_norm_rope_kernel|residual_norm}" \
      --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-40}" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      "$bin/kernel_bandwidth_bench" > "$OUT/ncu.txt" 2>&1
    t "ncu rc $?"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit Reg|Warp Cycles Per Issued|Grid Size|Block Size" "$OUT/ncu.txt" |
      sed -E 's/_ZN8twinstep[^ (]*//' | cut -c1-160 | head -${NCU_LINES:-150}
    ;;
  kernel)
    timeout 60 "$bin/kernel_gates" > "$OUT/kernel_gates.log" 2>&1
    t "kernel_gates rc $?"
    LINES_MAX=40 summary "$OUT/kernel_gates.log"
    ;;
  trap)  # each trap alone in its process (a trap poisons the context)
    : > "$OUT/trap.log"
    for g in kernel_trap_kv_write_gate kernel_trap_qkv_write_gate; do
      [ -x "$bin/$g" ] || continue
      timeout 30 "$bin/$g" >> "$OUT/trap.log" 2>&1
      t "$g rc $?"
    done
    summary "$OUT/trap.log"
    ;;
  engine)
    quick=${QUICK-1}
    env ${quick:+TWINSTEP_BENCH_QUICK=1} timeout "${ENGINE_S:-100}" "$bin/engine_throughput_bench" ${ENGINE_ARGS} > "$OUT/engine.log" 2>&1
    t "engine_throughput_bench ${ENGINE_ARGS} rc $?"
    grep -E "== prefill|steps,|floor:|host path|phase|^  [a-z+ ()*|,0-9-]+ +[0-9.]+ +[0-9.]+%|forward|outside|step wall|== decode batch|median .* ms/step|graphs:|^\|" "$OUT/engine.log" | cut -c1-300 | head -120
    ;;
  model)
    timeout "${MODEL_S:-70}" "$bin/model_gates" --gtest_filter='ModelGates.*:DirectDeviceGate.*' > "$OUT/model_gates.log" 2>&1
    t "model_gates rc $?"
    LINES_MAX=80 summary "$OUT/model_gates.log"
    ;;
  graphs)
    timeout "${GRAPHS_S:-40}" "$bin/decode_graph_gates" > "$OUT/decode_graph_gates.log" 2>&1
    t "decode_graph_gates rc $?"
    LINES_MAX=30 summary "$OUT/decode_graph_gates.log"
    ;;
  esac
done
t "done"
