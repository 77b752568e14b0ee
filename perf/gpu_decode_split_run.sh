#!/usr/bin/env bash
# perf/gpu_decode_split_run.sh: device calls of the split-KV decode work (issue 13, session 5).
# Runs binaries built on the workstation and carried in build/h-decode/bin; logs under $OUT.
#   profile: the kernel bench (full table), then one ncu report per case (one launch of
#            decode_split_kernel each: local b=128, global b=128 x 8k, global b=16 x 8k), then
#            the engine's decode bench with whatever time is left.
#   final:   the kernel bench of the committed v2 kernel (bin/decode_attention_bench_v2) and of
#            the new one, the split gates, the trap gate, the graph gates, the engine decode bench.
set -o pipefail
OUT=${OUT:-/tmp/out}
mode=${1:-profile}
budget=${2:-140}  # seconds this script may take (below the call's timeout_s)
bin=build/h-decode/bin
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null)/lib:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
left() { echo $((budget - SECONDS)); }
if [ "$mode" = profile ]; then
  "$bin/decode_attention_bench" 2>&1 | tee "$OUT/bench.log"
  for c in local:128:1024 global:128:8192 global:16:8192; do
    name=ncu_${c//:/_}
    echo "== ncu $c (t=${SECONDS}s)"
    timeout $(( $(left) - 20 )) ncu --clock-control none --set full -k regex:decode_split_kernel \
      --launch-skip 2 --launch-count 1 -o "$OUT/$name" \
      "$bin/decode_attention_bench" --only "$c" --no-reference > "$OUT/ncu_run.log" 2>&1 ||
      tail -5 "$OUT/ncu_run.log"
    ncu --import "$OUT/$name.ncu-rep" --page details >> "$OUT/ncu_details.txt" 2>&1
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass \
      > "$OUT/${name}_sass.csv" 2>&1
  done
  grep -E "^  [A-Z].*(Throughput|Hit Rate|Busy|Issued|Eligible|Active Warps|Registers|Achieved|Theoretical Occ|Duration|Stall)" "$OUT/ncu_details.txt" | head -150
  gzip -f "$OUT"/ncu_*_sass.csv; tar cf "$OUT/sass.tar" -C "$OUT" $(cd "$OUT" && ls ncu_*_sass.csv.gz) && rm -f "$OUT"/ncu_*_sass.csv.gz
  echo "== engine decode (t=${SECONDS}s, $(left) s left)"
  timeout --signal=KILL $(( $(left) - 3 )) "$bin/engine_throughput_bench" --decode > "$OUT/engine.log" 2>&1
  echo "engine rc $?"; grep -E "^== |ms/step|phase|attention|gemm|  [a-z_ ]+ +[0-9.]+ +[0-9.]+%" "$OUT/engine.log" | head -80
else
  for b in decode_attention_bench_v2 decode_attention_bench; do
    echo "== $b (t=${SECONDS}s)"; "$bin/$b" 2>&1 | tee "$OUT/$b.log"
  done
  for g in decode_split_gates decode_split_trap_gate decode_graph_gates; do
    echo "== $g (t=${SECONDS}s)"
    timeout 60 "$bin/$g" > "$OUT/$g.log" 2>&1; echo "$g rc $?"
    grep -E "^\[ *(OK|FAILED|PASSED) |^  |Failure|error" "$OUT/$g.log" | head -40
  done
  echo "== engine decode (t=${SECONDS}s, $(left) s left)"
  timeout --signal=KILL $(( $(left) - 3 )) "$bin/engine_throughput_bench" --decode > "$OUT/engine.log" 2>&1
  echo "engine rc $?"; cat "$OUT/engine.log" | tail -120
fi
echo "done t=${SECONDS}s"
