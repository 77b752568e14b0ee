#!/usr/bin/env bash
# perf/gpu_prefill7_run.sh: a device call of issue 12's session-7 work (the q/k norm + rope + KV
# write at 8192 rows): binaries built here (build/h-prefill7, gpu-gates variables), carried as
# .prefill7-carry/bin (stripped copies). Logs under $OUT (<= 8 files).
#   PARTS: which parts run, in this order (default: ncu bw kernel trap engine)
#     ncu     ncu --clock-control none of the q/k norm + rope + KV write kernels at the 12B's
#             8192-row local and global shapes alone (kernel_bandwidth_bench with
#             TWINSTEP_BW_PROFILE=1 TWINSTEP_BW_ONLY=qkv: device-side fill, nothing else)
#     bw      kernel_bandwidth_bench, q/k norm + rope + KV write sections (TWINSTEP_BW_ONLY=qkv)
#     kernel  every KernelGates test; trap: the q/k/v write's trap gate
#     engine  engine_throughput_bench with TWINSTEP_BENCH_QUICK=1 (prefill, phases, decode);
#             ENGINE_QKV: TWINSTEP_QKV_WRITE for it ("" = the forward's rule; "pick": "items",
#             "items-capped" or "items-packed", whichever the bw part just timed fastest at local
#             8192 rows, if faster than the pair, else the rule)
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, summary
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
bin=$PWD/.prefill7-carry/bin
ls "$bin/" | tr '\n' ' '; echo
for part in ${PARTS:-ncu bw kernel trap engine}; do
  case $part in
  ncu)
    ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    details=""  # the sections' bodies (the stall reasons' table) where this ncu has the option
    "$ncu_bin" --help 2>/dev/null | grep -q -- "--print-details" && details="--print-details all"
    TWINSTEP_BW_PROFILE=1 TWINSTEP_BW_ONLY=qkv timeout "${NCU_S:-90}" "$ncu_bin" \
      --clock-control none -k regex:"${NCU_K:-qkv_items_kernel|qkv_write_kernel|kv_write_kernel|qk_norm_rope_kernel}" \
      --launch-count "${NCU_COUNT:-40}" $details \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section InstructionStats \
      "$bin/kernel_bandwidth_bench" > "$OUT/ncu.txt" 2>&1
    t "ncu rc $?"
    grep -E "^  [a-zA-Z_].*\(|^    Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|No Eligible|Executed Instructions  |Stall Long Scoreboard|Stall Wait|Stall Math|Stall Barrier|Stall Short|Stall Not Sel|Stall MIO|Stall LG|Stall Drain|Stall Branch|Stall Dispatch|Stall No Inst|Stall Selected|Stall Tex|Stall Membar|Stall Sleep|Stall Misc|Stall Lg" "$OUT/ncu.txt" |
      sed -E 's/_ZN8twinstep[^ (]*//; s/twinstep::kernels::\(anonymous namespace\):://' | cut -c1-150 | head -${NCU_LINES:-260}
    ;;
  bw)
    TWINSTEP_BW_ONLY=qkv timeout 60 "$bin/kernel_bandwidth_bench" > "$OUT/bw.log" 2>&1
    t "kernel_bandwidth_bench rc $?"
    cat "$OUT/bw.log"
    ;;
  kernel)
    timeout 60 "$bin/kernel_gates" > "$OUT/kernel_gates.log" 2>&1
    t "kernel_gates rc $?"
    LINES_MAX=40 summary "$OUT/kernel_gates.log"
    ;;
  trap)  # alone in its process (a trap poisons the context)
    timeout 30 "$bin/kernel_trap_qkv_write_gate" > "$OUT/trap.log" 2>&1
    t "kernel_trap_qkv_write_gate rc $?"
    summary "$OUT/trap.log"
    ;;
  engine)
    if [ "$ENGINE_QKV" = pick ]; then  # the fastest at local 8192 rows, if faster than the pair
      ENGINE_QKV=$(awk '/^local 8192 both \(before\)/{best=$(NF-6); pick=""}
        /^local 8192 warp items /{if ($(NF-6) + 0 < best + 0) {best=$(NF-6); pick="items"}}
        /^local 8192 items, capped/{if ($(NF-6) + 0 < best + 0) {best=$(NF-6); pick="items-capped"}}
        /^local 8192 items, packed/{if ($(NF-6) + 0 < best + 0) {best=$(NF-6); pick="items-packed"}}
        END{print pick}' "$OUT/bw.log")
      t "picked TWINSTEP_QKV_WRITE=${ENGINE_QKV:-unset (the pair was fastest)}"
    fi
    env TWINSTEP_BENCH_QUICK=1 ${ENGINE_QKV:+TWINSTEP_QKV_WRITE=$ENGINE_QKV} \
      timeout "${ENGINE_S:-100}" "$bin/engine_throughput_bench" > "$OUT/engine.log" 2>&1
    t "engine_throughput_bench (TWINSTEP_QKV_WRITE=${ENGINE_QKV:-unset}) rc $?"
    grep -E "== prefill|steps,|host path|phase|^  [a-z+ ()*|,0-9-]+ +[0-9.]+ +[0-9.]+%|forward|outside|== decode batch|median .* ms/step|graphs:|^\|" "$OUT/engine.log" | cut -c1-300 | head -100
    ;;
  esac
done
t "done"
