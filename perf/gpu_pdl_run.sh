#!/usr/bin/env bash
# perf/gpu_pdl_run.sh: the skinny decode GEMM with programmatic dependent launch (issue 13,
# session 6) on the binaries built here and carried (BIN). Parts, each under its own time limit,
# logs under $OUT:
#   bench   skinny_gemm_bench --pdl: tuned vs skinny vs skinny+PDL per GEMM at m = 1, 8, 16 and
#           whole decode-step chains captured in one graph per arm
#   gates   skinny_gemm_gates (the PDL chain bitwise against plain launches among them)
#   engine_pdl / engine_plain / engine_off  engine_throughput_bench --decode (sections 2 only,
#           TWINSTEP_BENCH_QUICK) with TWINSTEP_SKINNY=16 (skinny + PDL for m <= 16), =16,plain,
#           and unset (cuBLAS tuned plans); the same binary, one process each
# PARTS picks which (default "bench gates engine_pdl engine_off engine_plain").
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
BIN=${BIN:-build/h-pdl/bin}
for p in ${PARTS:-bench gates engine_pdl engine_off engine_plain}; do
  case $p in
    bench) part bench "${LIMIT_BENCH:-30}" "$BIN/skinny_gemm_bench" --pdl ;;
    gates) part gates "${LIMIT_GATES:-30}" "$BIN/skinny_gemm_gates" ;;
    engine_pdl) TWINSTEP_SKINNY=16 TWINSTEP_BENCH_QUICK=1 part engine_pdl \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_plain) TWINSTEP_SKINNY=16,plain TWINSTEP_BENCH_QUICK=1 part engine_plain \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_off) TWINSTEP_BENCH_QUICK=1 part engine_off \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
  esac
done
for f in "$OUT"/*.log; do
  echo "---- $f"
  grep -E "^copy|^tuned arm|^\| (local|global|gate|down|LM)|  m=|chain|back to back|median .* ms/step|graphs: |decode graphs|PASSED|FAILED|OK \]|\[gate\]|Failure|error|expected" "$f" | head -70
done
