#!/usr/bin/env bash
# perf/gpu_l2_prefetch_run.sh: the one device call of issue 13's L2 prefetch of the next GEMM's
# weights (session 5, helper "prefetch"). Binaries built on the workstation (build/h-prefetch,
# gpu-gates variables) and carried stripped as build/h-prefetch/carry/bins.tgz (bin/...); the
# model gates find their build dir (hf_refs, twinstep-generate) at the path compiled into them.
# In order: the bench's A/B (--decode-prefetch: the probe, then every arm at b=128, 64, 16, 1),
# DecodeGraphGates with TWINSTEP_L2_PREFETCH on for every bucket, ncu of the probe (L2 hit rate
# of each GEMM, cold vs prefetched), then ModelGates (filtered, prefetch on) in the time left. Logs under $OUT.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
build=/work/main/build/h-prefetch  # TWINSTEP_BINARY_DIR of the carried model gates
carry=$PWD/build/h-prefetch/carry
tar -xzf "$carry/bins.tgz" -C "$carry"
link_build_bin "$build" "$carry/bin"
bin=$build/bin
ls "$bin" | tr '\n' ' '; echo
SUMMARY_CUT=300 LINES_MAX=${LINES_MAX:-40}  # summary (gpu_env.sh): this script's widths
timeout ${BENCH_S:-70} "$bin/engine_throughput_bench" --decode-prefetch > "$OUT/bench.log" 2>&1
t "engine_throughput_bench --decode-prefetch rc $?"
grep -E "^device|copy bandwidth|captured|^probe|l2 prefetch A/B|eager decode step|gate_up|down|qkv|step wall" \
  "$OUT/bench.log" | cut -c1-330 | head -90
export TWINSTEP_L2_PREFETCH=32,128  # every bucket of the graph gates, every small step
timeout ${GRAPH_S:-22} "$bin/decode_graph_gates" > "$OUT/decode_graph_gates.log" 2>&1
t "decode_graph_gates (TWINSTEP_L2_PREFETCH=$TWINSTEP_L2_PREFETCH) rc $?"
LINES_MAX=20 summary "$OUT/decode_graph_gates.log"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
left() {  # left CAP: seconds left of BUDGET_S, at most CAP, at least 1
  local l=$((${BUDGET_S:-146} - ($(date +%s) - start)))
  [ "$l" -gt "$1" ] && l=$1
  [ "$l" -lt 1 ] && l=1
  echo "$l"
}
env -u TWINSTEP_L2_PREFETCH timeout "$(left 30)" "$ncu" --profile-from-start off --cache-control none --clock-control none \
  --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum --csv \
  "$bin/engine_throughput_bench" --prefetch-probe > "$OUT/ncu_probe.csv" 2> "$OUT/ncu_probe.err"
t "ncu probe rc $?"
python3 - "$OUT/ncu_probe.csv" <<'PY' | head -80
import csv, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
by = {}
for r in csv.DictReader(rows):
    k = (int(r["ID"]), r["Kernel Name"][:48])
    by.setdefault(k, {})[r["Metric Name"]] = r["Metric Value"]
for (i, name), m in sorted(by.items()):
    print(i, name, "time", m.get("gpu__time_duration.sum"), "L2 hit %", m.get("lts__t_sector_hit_rate.pct"),
          "dram read", m.get("dram__bytes_read.sum"))
PY
tail -3 "$OUT/ncu_probe.err"
timeout "$(left 60)" "$bin/model_gates" \
  --gtest_filter='ModelGates.PagedMatchesOracleForward:ModelGates.GreedyMatchesHfGenerate:DirectDeviceGate.*' \
  > "$OUT/model_gates.log" 2>&1
t "model_gates (filtered, TWINSTEP_L2_PREFETCH=$TWINSTEP_L2_PREFETCH) rc $?"
LINES_MAX=30 summary "$OUT/model_gates.log"
