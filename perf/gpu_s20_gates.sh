#!/usr/bin/env bash
# perf/gpu_s20_gates.sh (session 20): the gates of what this session changed, when the device
# budget has no room for every gate (~440 s): the gated GEMM (clusters of four), NCCL (one
# rank), the split decode attention (the folded write), the decode graphs and the model gates
# (HF parity, teacher-forced logits, paged vs oracle) on the forward's defaults, via ctest
# (the preset's registration). CTEST_REGEX narrows it further.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
build_gates
t built
timeout "${CTEST_TIMEOUT:-480}" ctest --preset gpu-gates \
  -R "${CTEST_REGEX:-GatedGemmGates|NcclGates|TpLoopbackGates|DecodeSplitGates|DecodeGraphGates|ModelGates}" \
  > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
grep -E "\[gate\] (gated GEMM resident|NCCL|.*HF|g12b|gsoft)" "$OUT/ctest.log" | cut -c1-220 | head -20
t done
cd "$OUT" && gzip -9 ctest.log
