#!/usr/bin/env bash
# perf/gpu_s22_gates.sh (session 22): every gate (ctest --preset gpu-gates) over as many calls on
# one warm machine as it takes. 88 gates no longer fit one call with the build (session 19: 81
# gates, 374 s of ctest and 68 s of build); the build folder stays on a warm machine between
# calls, and so does the record this script keeps in it: build/gpu-gates/gates_ran.txt, the
# numbers of the gates that have run (passed or failed) since the tree was built. Each call runs
# the gates not in it, in what is left of END_S (default 560 s after the start), and prints the
# totals so far: the call that prints "left 0" has run every gate of the manifest's preset.
# FRESH=1 forgets the record (a new tree: the build is redone anyway, the record is not).
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
apply_decision  # the q/k/v write's default as perf/gpu_s22_h200.sh decided on this machine
build_gates
t built
rec=build/gpu-gates/gates_ran.txt
[ -n "${FRESH:-}" ] && rm -f "$rec"
touch "$rec" build/gpu-gates/gates_results.txt
[ -n "${FRESH:-}" ] && : > build/gpu-gates/gates_results.txt
all=$(ctest --preset gpu-gates -N | sed -nE 's/^ *Test +#([0-9]+):.*/\1/p')
left=$(comm -23 <(tr ' ' '\n' <<< "$all" | sort) <(sort -u "$rec") | sort -n | paste -sd,)
echo "gates: $(wc -w <<< "$all") in the preset, $(sort -u "$rec" | wc -l) ran before this call"
if [ -n "$left" ]; then
  limit=$((${END_S:-560} - ($(date +%s) - start)))
  # -I START,END,STRIDE,N...: with START=END=0 only the numbers listed.
  timeout "$limit" ctest --preset gpu-gates -I "0,0,0,$left" > "$OUT/ctest.log" 2>&1
  echo "ctest: exit $? (limit $limit s)"
  sed -nE 's/.*Test +#([0-9]+): ([^ ]+) \.+.*(Passed|Failed|\*\*\*[A-Za-z ]+|Not Run).*/\1 \2 \3/p' \
    "$OUT/ctest.log" | tee -a build/gpu-gates/gates_results.txt | awk '{print $1}' >> "$rec"
  grep -E "\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
  grep -E "\[gate\] stream_gemm_gated|\[gate\] .*HF|\[gate\] .*TP|calibration was fitted" \
    "$OUT/ctest.log" | cut -c1-260 | head -24
fi
res=build/gpu-gates/gates_results.txt
echo "so far: $(grep -c ' Passed$' "$res") passed, $(grep -vc ' Passed$' "$res") not passed," \
  "left $(comm -23 <(tr ' ' '\n' <<< "$all" | sort) <(sort -u "$rec") | wc -l)"
grep -v ' Passed$' "$res" | head -20
t done
cp "$res" "$OUT/gates_results.txt"
[ -f "$OUT/ctest.log" ] && gzip -9 "$OUT/ctest.log"
