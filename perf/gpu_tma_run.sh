#!/usr/bin/env bash
# perf/gpu_tma_run.sh: one device call of the TMA prefill attention work (issue 12): the
# attention gates, the trap gate, the attention bench, and ncu on the default cp.async wgmma
# kernels and the TMA ones (one launch each, the bench's 4 x 2048 shapes, clocks as found).
# Usage: perf/gpu_tma_run.sh BIN_DIR [ncu [KERNEL_REGEX...]]   (logs under $OUT)
set -u
B=${1:?bin dir}
OUT=${OUT:-/tmp/tma_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv > "$OUT/run.log" 2>&1
timeout 150 "$B/prefill_tc_gates" > "$OUT/gates.log" 2>&1
echo "prefill_tc_gates rc $?" >> "$OUT/run.log"
timeout 60 "$B/prefill_tc_trap_gate" > "$OUT/trap.log" 2>&1
echo "prefill_tc_trap_gate rc $?" >> "$OUT/run.log"
timeout 200 "$B/prefill_attention_bench" > "$OUT/bench.log" 2>&1
echo "prefill_attention_bench rc $?" >> "$OUT/run.log"
if [ "${2:-}" = ncu ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  KILL=""
  "$NCU" --help 2>/dev/null | grep -q -- "--kill" && KILL="--kill yes"
  shift 2
  ks=("$@")
  [ ${#ks[@]} -eq 0 ] && ks=(wgmma_pair_kernel wgmma512_kernel tma256_kernel tma512_kernel)
  for k in "${ks[@]}"; do
    timeout 120 "$NCU" --clock-control none --set full -k "regex:$k" -c 1 $KILL -f -o "$OUT/$k" \
      "$B/prefill_attention_bench" > /dev/null 2>> "$OUT/run.log"
    echo "ncu $k rc $?" >> "$OUT/run.log"
    "$NCU" -i "$OUT/$k.ncu-rep" --page details >> "$OUT/ncu_details.txt" 2>&1
    "$NCU" -i "$OUT/$k.ncu-rep" --page raw --csv >> "$OUT/ncu_raw.csv" 2>&1
    if [ -n "${NCU_SOURCE:-}" ]; then  # per-SASS-instruction stall samples
      "$NCU" -i "$OUT/$k.ncu-rep" --page source --csv --print-source sass \
        > "$OUT/ncu_source_$k.csv" 2>&1
    fi
    rm -f "$OUT/$k.ncu-rep"
  done
fi
grep -E "^\[gate\]|FAILED|PASSED|OK \]" "$OUT/gates.log" | tail -n 60
cat "$OUT/run.log"
cat "$OUT/bench.log"
