#!/usr/bin/env bash
# perf/gpu_gemm_search_run.sh: the enumerated cuBLASLt search (issues 13 and 12, session 6) on
# the binaries built here and carried (BIN). Parts, each under its own time limit so one cannot
# starve the others, logs under $OUT:
#   bench  skinny_gemm_bench: both searches' tuning reports and the decode / prefill GEMM A/B
#   gates  gemm_lt_gates' tuned-plan gates (the enumerated and forced split-K plans among them)
#   engine engine_throughput_bench with no option (prefill, decode tables, long context), the
#          default search (TWINSTEP_GEMM_SEARCH unset unless the caller sets it)
#   engine_decode_heuristic  engine_throughput_bench --decode with TWINSTEP_GEMM_SEARCH=heuristic
# PARTS picks which (default "bench gates engine").
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
BIN=${BIN:-build/h-blaslt/bin}
for p in ${PARTS:-bench gates engine}; do
  case $p in
    bench) part bench "${LIMIT_BENCH:-60}" "$BIN/skinny_gemm_bench" ;;
    gates) part gates "${LIMIT_GATES:-45}" "$BIN/gemm_lt_gates" \
      --gtest_filter="${GATES_FILTER:-GemmLtGates.Enumerated*:GemmLtGates.Tuned*}" ;;
    skinny) part skinny "${LIMIT_SKINNY:-30}" "$BIN/skinny_gemm_gates" ;;
    engine)  # sections 1-3 and their summary; stopped once the summary is out (the sections
      # after it build their own devices and are not this script's business)
      t0=$(date +%s)
      timeout "${LIMIT_ENGINE:-80}" "$BIN/engine_throughput_bench" > "$OUT/engine.log" 2>&1 &
      pid=$!
      while kill -0 $pid 2>/dev/null; do
        if grep -q "^== summary" "$OUT/engine.log"; then sleep 2; kill $pid; break; fi
        sleep 1
      done
      wait $pid
      echo "== engine (engine_throughput_bench, TWINSTEP_GEMM_SEARCH=${TWINSTEP_GEMM_SEARCH:-}): exit $?, $(($(date +%s) - t0)) s" ;;
    engine_decode_heuristic)  # the A/B arm: the same binary with the session-4 search
      TWINSTEP_GEMM_SEARCH=heuristic part engine_decode_heuristic "${LIMIT_ENGINE_DECODE:-60}" \
        "$BIN/engine_throughput_bench" --decode ;;
  esac
done
for f in "$OUT"/*.log; do
  echo "---- $f"
  grep -E "^tuning|^copy|^\| +[0-9]+ \||decode graphs|ms/step|^\| (prefill|decode)|PASSED|FAILED|OK \]|force_splits|Failure|^prefill GEMMs" "$f" | head -60
done
