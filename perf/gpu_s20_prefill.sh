#!/usr/bin/env bash
# perf/gpu_s20_prefill.sh (session 20, issue 12): the gated GEMM in clusters of FOUR blocks
# (TWINSTEP_GATED_GEMM_EPILOGUE=staged4: each block fetches a quarter of a tile's weight rows
# and multicasts it to the other three) against the default pairs (staged), in the engine's
# prefill step. Why: under the 700 W cap the step is energy-bound; pairs halved the weights' L2
# reads and bought ~3% clock (session 12: 1485 against 1440 MHz); four blocks cut the block's L2
# reads a k-slice from 32 KB to 24 KB. Costs: SMs of a GPC that make no whole cluster of four
# idle (the gate prints the resident clusters). The gated GEMM gates first (clusters of four
# bitwise equal to lone blocks), then one process an arm, alternating, three rounds, with an
# nvidia-smi log (clock, power) beside them.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates gated_gemm_gates engine_throughput_bench
t built
BIN=build/gpu-gates/bin
part gates 120 "$BIN/gated_gemm_gates"
SUMMARY_CUT=240 summary "$OUT/gates.log" | grep -E "resident|12B|OK|FAIL|rror|xpected" | head -20
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active \
  --format=csv,noheader -lms 100 > "$OUT/smi.csv" 2>&1 &
smi=$!
for round in 1 2 3; do
  for arm in staged staged4; do
    echo "$(date +%T.%N | cut -c1-12) start $arm $round" >> "$OUT/marks.txt"
    TWINSTEP_GATED_GEMM_EPILOGUE=$arm TWINSTEP_BENCH_PREFILL_OBSERVE=1 part "pf_${arm}_$round" 90 \
      "$BIN/engine_throughput_bench" --prefill
    echo "$(date +%T.%N | cut -c1-12) end $arm $round" >> "$OUT/marks.txt"
    echo "$arm $round: $(grep -E "^\| prefill 16x2048" "$OUT/pf_${arm}_$round.log" | cut -c1-70)"
    grep -oE "OBSERVED .*wall [0-9.]+|gate_up [0-9.]+" "$OUT/pf_${arm}_$round.log" |
      sed 's/OBSERVED start_epoch_ms [0-9.]* //' | paste -sd' ' | cut -c1-240
  done
done
kill $smi
# Mean SM clock and power while each arm ran (samples between its marks, at >= 600 W).
python3 - "$OUT/marks.txt" "$OUT/smi.csv" <<'PY'
import sys
marks = [l.split() for l in open(sys.argv[1])]
rows = []
for l in open(sys.argv[2]):
    f = [x.strip() for x in l.split(",")]
    try:
        rows.append((f[0].split()[1][:12], float(f[1].split()[0]), float(f[2].split()[0])))
    except (IndexError, ValueError):
        pass
for i in range(0, len(marks) - 1, 2):
    a, b = marks[i][0], marks[i + 1][0]
    hot = [(c, p) for t, c, p in rows if a <= t <= b and p >= 600]
    if hot:
        print(f"{marks[i][2]} {marks[i][3]}: {len(hot)} samples >= 600 W, "
              f"SM {sum(c for c, _ in hot) / len(hot):.0f} MHz, {sum(p for _, p in hot) / len(hot):.0f} W")
PY
t done
cd "$OUT" && tar czf prefill_logs.tgz ./*.log smi.csv marks.txt && rm -f ./*.log smi.csv marks.txt
