#!/usr/bin/env bash
# perf/gpu_stream_run.sh: the streamed few-row decode GEMM (kernels/gemm_stream.h, issue 13,
# session 7) on binaries built here and carried (BIN). Parts, each under its own time limit,
# logs under $OUT:
#   bench   skinny_gemm_bench --pdl: tuned cuBLAS/cuBLASLt vs the register-fed skinny kernel vs
#           the streamed kernel, each plain and with PDL, per GEMM at m = 1, 8, 16, and whole
#           decode-step chains captured in one graph per arm
#   gates   skinny_gemm_gates (SkinnyGemmGates.* and StreamGemmGates.*)
#   graphs  decode_graph_gates' StreamedFewRowGemmAndProgrammaticDecodeMatchPlainBitwise
#   engine_off / engine_stream / engine_stream_plain / engine_chain  engine_throughput_bench
#           --decode (section 2, TWINSTEP_BENCH_QUICK) with TWINSTEP_SKINNY unset (the build's
#           default), =16 (streamed + PDL for m <= 16), =16,plain, and =16 with
#           TWINSTEP_DECODE_PDL=1 (the short kernels programmatic too); one process each
# PARTS picks which (default "gates graphs bench engine_off engine_stream engine_chain
# engine_stream_plain").
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, LD_LIBRARY_PATH (cuDNN), t, part, summary
BIN=${BIN:-build/h-pdl/bin}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in ${PARTS:-gates graphs bench engine_off engine_stream engine_chain engine_stream_plain}; do
  case $p in
    bench) part bench "${LIMIT_BENCH:-40}" "$BIN/skinny_gemm_bench" --pdl ;;
    gates) part gates "${LIMIT_GATES:-40}" "$BIN/skinny_gemm_gates" ;;
    graphs) part graphs "${LIMIT_GRAPHS:-60}" "$BIN/decode_graph_gates" \
      --gtest_filter='*StreamedFewRowGemm*' ;;
    engine_chain) TWINSTEP_SKINNY=16 TWINSTEP_DECODE_PDL=1 TWINSTEP_BENCH_QUICK=1 part engine_chain \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_off) (unset TWINSTEP_SKINNY TWINSTEP_DECODE_PDL; TWINSTEP_BENCH_QUICK=1 part engine_off \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode) ;;
    engine_stream) TWINSTEP_SKINNY=16 TWINSTEP_BENCH_QUICK=1 part engine_stream \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_stream_plain) TWINSTEP_SKINNY=16,plain TWINSTEP_BENCH_QUICK=1 part engine_stream_plain \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
    engine_zero) TWINSTEP_SKINNY=0 TWINSTEP_BENCH_QUICK=1 part engine_zero \
      "${LIMIT_ENGINE:-25}" "$BIN/engine_throughput_bench" --decode ;;
  esac
done
for f in "$OUT"/*.log; do
  echo "---- $f"
  grep -E "^copy|^tuned arm|^\| (local|global|gate|down|LM)|  m=|chain|back to back|median .* ms/step|graphs: |decode graphs|PASSED|FAILED|OK \]|\[gate\]|Failure|error|expected|Which is" "$f" | cut -c1-400 | head -80
done
