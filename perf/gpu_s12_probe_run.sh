#!/usr/bin/env bash
# perf/gpu_s12_probe_run.sh (session 12, issue 12): what bounds the gated GEMM at 8192 rows.
# skinny_gemm_bench --gated-probe (design variants in turns, bitwise checks, ~2.5 s sustained
# segments) beside an nvidia-smi log of SM clock and power, summarised per segment; then ncu of
# cuBLAS's gate|up, the gated GEMM and its tensor-store variant (clock control none).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
build_gates skinny_gemm_bench gated_gemm_gates
t built
BIN=build/gpu-gates/bin
part gates 60 "$BIN/gated_gemm_gates"
SUMMARY_CUT=200 summary "$OUT/gates.log" | grep -E "OK|FAIL|12B|windows"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 50 > "$OUT/smi.csv" 2>&1 &
smi=$!
part probe 200 "$BIN/skinny_gemm_bench" --gated-probe
kill $smi
grep -v "^SEG" "$OUT/probe.log" | tail -30
python3 - "$OUT/probe.log" "$OUT/smi.csv" <<'PY'
import sys, datetime, statistics
segs = [l[4:].strip().split("|") for l in open(sys.argv[1]) if l.startswith("SEG ")]
rows = []
for l in open(sys.argv[2]):
    f = [x.strip() for x in l.split(",")]
    try:
        t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp() * 1000
        rows.append((t, float(f[1]), float(f[2]), float(f[3]), f[4]))
    except Exception:
        pass
print("segment | ms/launch | SM MHz median (min) | W median | temp | reasons")
for f in segs:
    name, (b, e, per) = "|".join(f[:-3]), f[-3:]  # a name may hold '|' (cuBLAS gate|up)
    b, e = float(b) + 600, float(e)  # skip the first 0.6 s
    s = [r for r in rows if b <= r[0] <= e]
    if not s:
        print(name, "no samples"); continue
    mhz = [r[1] for r in s]; w = [r[2] for r in s]
    reasons = sorted(set(r[4] for r in s))
    print(f"{name} | {float(per):.3f} | {statistics.median(mhz):.0f} ({min(mhz):.0f}) | {statistics.median(w):.0f} | {s[-1][3]:.0f} | {' '.join(reasons)}")
PY
ncu --clock-control none --profile-from-start off --metrics \
gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes.sum.per_second,sm__warps_active.avg.pct_of_peak_sustained_active \
  "$BIN/skinny_gemm_bench" --gated-profile > "$OUT/ncu.log" 2>&1
echo "== ncu exit $?"
grep -E "gated_gemm|nvjet|sm90|gpu__time|per_second|pct|sectors" "$OUT/ncu.log" | cut -c1-150 | head -40
t done
