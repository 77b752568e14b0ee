#!/usr/bin/env bash
# perf/gpu_s22_first.sh (session 22): the first call on whichever card comes. On an H200 (over
# 100 GB) the decode close (perf/gpu_s22_h200.sh: the folded q/k/v write decided by the quick
# A/B, made the default on a win, then the kernel bench and the full decode bench; the gates
# follow in perf/gpu_s22_gates.sh calls); on an H100 the quick A/B and the tensor-parallel,
# split-decode, graph, gated-GEMM and model gates (perf/gpu_s21_any.sh).
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mib:-0}" -gt 100000 ]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/gpu_s22_h200.sh"
else
  bash "$(dirname "${BASH_SOURCE[0]}")/gpu_s21_any.sh"
fi
