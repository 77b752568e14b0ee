#!/usr/bin/env bash
# perf/gpu_s18b_run.sh (session 18, call B): the streamed few-row GEMM from one row with the
# gate|up GEMM's GELU folded in (stream_gemm_gated) as the new default. First the decode A/B,
# one process an arm, alternating: the default (1-16, gated), TWINSTEP_SKINNY=1-16,k256 (from
# one row, gelu_tanh_mul apart) and 9-16,k256 (session 17's default); then the new gate alone
# (its lines), then every gate (ctest --preset gpu-gates) on the defaults.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
[ "${mib:-0}" -lt 100000 ] && export TWINSTEP_BENCH_DECODE_MAX_BATCH=64
build_gates
t built
BIN=build/gpu-gates/bin
for arm in def_1: nog_1:1-16,k256 old_1:9-16,k256 def_2: nog_2:1-16,k256 old_2:9-16,k256; do
  value=${arm#*:}  # empty: the default (TWINSTEP_SKINNY unset; "" would be a create() error)
  if [ -n "$value" ]; then export TWINSTEP_SKINNY=$value; else unset TWINSTEP_SKINNY; fi
  TWINSTEP_BENCH_QUICK=1 part "dec_${arm%%:*}" 100 "$BIN/engine_throughput_bench" --decode
  grep -E "^\| decode" "$OUT/dec_${arm%%:*}.log"
done
unset TWINSTEP_SKINNY
part gated 120 "$BIN/skinny_gemm_gates" --gtest_filter='StreamGemmGates.Gated*'
summary "$OUT/gated.log"
t gates start
timeout "${CTEST_TIMEOUT:-470}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
