#!/usr/bin/env bash
# perf/gpu_s18b_run.sh (session 18, call B): the streamed few-row GEMM from one row with the
# gate|up GEMM's GELU folded in (stream_gemm_gated) as the new default. First the decode A/B,
# one process an arm, alternating: the default (1-16, gated), TWINSTEP_SKINNY=1-16,k256 (from
# one row, gelu_tanh_mul apart) and 9-16,k256 (session 17's default); then the new gate alone
# (its lines), then every gate (ctest --preset gpu-gates) on the defaults.
. "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
card_setup
build_gates
t built
BIN=build/gpu-gates/bin
decode_arms def_1: nog_1:1-16,k256 old_1:9-16,k256 def_2: nog_2:1-16,k256 old_2:9-16,k256
part gated 120 "$BIN/skinny_gemm_gates" --gtest_filter='StreamGemmGates.Gated*'
summary "$OUT/gated.log"
t gates start
timeout "${CTEST_TIMEOUT:-470}" ctest --preset gpu-gates > "$OUT/ctest.log" 2>&1
echo "ctest: exit $?"
grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|Not Run|\*\*\*" "$OUT/ctest.log" | head -20
t done
cd "$OUT" && tar czf all_logs.tgz ./*.log && rm -f ./*.log
