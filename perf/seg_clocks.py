#!/usr/bin/env python3
"""perf/seg_clocks.py PROBE_LOG SMI_CSV: each "SEG name|begin_ms|end_ms|ms_per" line of a bench
log (skinny_gemm_bench --gated-probe) matched with the samples of an nvidia-smi log (timestamp,
clocks.sm, power.draw, temperature.gpu, clocks_event_reasons.active at 50 ms) taken beside it:
the segment's SM clock, power and throttle reasons (the first 0.6 s of a segment skipped)."""
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
