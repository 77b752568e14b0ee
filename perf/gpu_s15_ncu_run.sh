#!/usr/bin/env bash
# perf/gpu_s15_ncu_run.sh (session 15, issue 12): why the head_dim 512 cluster kernel
# (attention_prefill_wgmma512_cluster.cu, key tile 64, the default) takes ~8700 cycles a stage
# against ~2000 of tensor work: ncu (--set full, clocks as found) of its first launch in
# prefill_attention_bench (the 4 x 2048 global shape), the details page and the per-SASS
# instruction stall samples; then how the engine's prefill steps of one run spread, and the
# decode timeline (issue 13: TWINSTEP_BENCH_TRACE=1, quick). Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates prefill_attention_bench engine_throughput_bench
t built
BIN=build/gpu-gates/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 "$NCU" --clock-control none --set full --import-source yes -k regex:wgmma512_cluster \
  -c 1 --kill yes -f -o "$OUT/cluster" "$BIN/prefill_attention_bench" > "$OUT/ncu_run.log" 2>&1
echo "ncu: exit $?"
"$NCU" -i "$OUT/cluster.ncu-rep" --page details > "$OUT/ncu_details.txt" 2>&1
"$NCU" -i "$OUT/cluster.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source.csv" 2>&1
rm -f "$OUT/cluster.ncu-rep"
grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Tensor|Issue Slots Busy|Warp Cycles Per Issued|Executed Ipc A|No Eligible|Registers Per|Shared Memory Configuration Size|Achieved Occupancy" "$OUT/ncu_details.txt" | head -30
t ncu done
part prefill 60 "$BIN/engine_throughput_bench" --prefill
grep -E "steps, |each step|^\| prefill|^  attention|forward \(GPU|observed" "$OUT/prefill.log"
TWINSTEP_BENCH_TRACE=1 TWINSTEP_BENCH_QUICK=1 part trace 150 "$BIN/engine_throughput_bench" --decode
grep -E "^-- trace|^\| decode" "$OUT/trace.log" | head -20
t done
