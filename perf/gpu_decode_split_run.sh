#!/usr/bin/env bash
# perf/gpu_decode_split_run.sh: device calls of the split-KV decode work (issue 13, session 5).
# Runs binaries built on the workstation and carried in build/h-decode/bin; logs under $OUT.
#   profile: the kernel bench (full table), then one ncu report per case (one launch of
#            decode_split_kernel each: local b=128, global b=128 x 8k, global b=16 x 8k), then
#            the engine's decode bench with whatever time is left.
#   final:   the split gates, the trap gate, the graph gates; the kernel bench of the v2 kernel
#            (bin/decode_attention_bench_v2, built before the change), of the new one and of a
#            variant (*_kv: K copies one tile further ahead than V); the variant's gates when
#            it is faster; a short ncu of the faster passing one (two cases); the engine decode
#            bench with it, in the time left.
set -o pipefail
OUT=${OUT:-/tmp/out}
mode=${1:-profile}
budget=${2:-140}  # seconds this script may take (below the call's timeout_s)
bin=${BIN:-build/h-decode/bin}
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
  grep -E "^ +[A-Z].*(Throughput|Hit Rate|Busy|Issued|Eligible|Active Warps|Registers|Achieved|Theoretical Occ|Duration|Stall)" "$OUT/ncu_details.txt" | head -150
  gzip -f "$OUT"/ncu_*_sass.csv; tar cf "$OUT/sass.tar" -C "$OUT" $(cd "$OUT" && ls ncu_*_sass.csv.gz) && rm -f "$OUT"/ncu_*_sass.csv.gz
  echo "== engine decode (t=${SECONDS}s, $(left) s left)"
  timeout --signal=KILL $(( $(left) - 3 )) "$bin/engine_throughput_bench" --decode > "$OUT/engine.log" 2>&1
  echo "engine rc $?"; grep -E "^== |ms/step|phase|attention|gemm|  [a-z_ ]+ +[0-9.]+ +[0-9.]+%" "$OUT/engine.log" | head -80
else
  gate() {  # gate NAME BINARY: one gate binary, its log appended to gates.log; returns its rc
    echo "== $1 ($2, t=${SECONDS}s)" | tee -a "$OUT/gates.log"
    timeout 60 "$bin/$2" > "$OUT/gate_run.log" 2>&1
    local rc=$?
    cat "$OUT/gate_run.log" >> "$OUT/gates.log"
    echo "$1 rc $rc"
    grep -E "^\[ *(OK|FAILED|PASSED) |^  [a-z0-9 ]|Failure|error" "$OUT/gate_run.log" | head -40
    rm -f "$OUT/gate_run.log"
    return $rc
  }
  gate split decode_split_gates
  gate trap decode_split_trap_gate
  gate graphs decode_graph_gates
  for b in decode_attention_bench_v2 decode_attention_bench decode_attention_bench_kv; do
    echo "== $b (t=${SECONDS}s)"; "$bin/$b" > "$OUT/$b.log" 2>&1; cat "$OUT/$b.log"
  done
  gbs() {  # gbs LOG FAMILY BATCH CONTEXT: the split kernel's GB/s in that row
    awk -v fam="$2" -v b="$3" -v c="$4" '/^local/{f="local"} /^global/{f="global"}
      f == fam && $1 == b && $2 == c {print $11}' "$OUT/$1.log"
  }
  nl=$(gbs decode_attention_bench local 128 1024); ng=$(gbs decode_attention_bench global 128 8192)
  kl=$(gbs decode_attention_bench_kv local 128 1024); kg=$(gbs decode_attention_bench_kv global 128 8192)
  echo "new local $nl global $ng; kv local $kl global $kg"
  engine=engine_throughput_bench; pick=decode_attention_bench
  if awk -v nl="$nl" -v ng="$ng" -v kl="$kl" -v kg="$kg" 'BEGIN {
       exit !(kl + kg > 1.02 * (nl + ng) && kl >= 0.98 * nl && kg >= 0.98 * ng) }'; then
    echo "kv variant faster: its gates"
    if gate split_kv decode_split_gates_kv && gate trap_kv decode_split_trap_gate_kv; then
      engine=engine_throughput_bench_kv; pick=decode_attention_bench_kv
    fi
  fi
  echo "engine: $engine, ncu: $pick"
  for c in local:128:1024 global:128:8192; do
    echo "== ncu $pick $c (t=${SECONDS}s)" >> "$OUT/ncu_new.txt"
    timeout 30 ncu --clock-control none --section SpeedOfLight --section SchedulerStats \
      --section WarpStateStats --section InstructionStats --section LaunchStats \
      -k regex:decode_split_kernel --launch-skip 2 --launch-count 1 \
      "$bin/$pick" --only "$c" --no-reference >> "$OUT/ncu_new.txt" 2>&1
  done
  grep -E "^== ncu|Duration|DRAM Through|Issue Slots|Eligible Warps|Executed Instructions  |Registers Per" "$OUT/ncu_new.txt"
  echo "== engine decode $engine (t=${SECONDS}s, $(left) s left)"
  timeout --signal=KILL $(( $(left) - 3 )) "$bin/$engine" --decode > "$OUT/engine.log" 2>&1
  echo "engine rc $?"; grep -vE "^  host phases" "$OUT/engine.log" | tail -75
fi
echo "done t=${SECONDS}s"
