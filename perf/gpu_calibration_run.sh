#!/usr/bin/env bash
# perf/gpu_calibration_run.sh (issue 10): one device call that calibrates the simulator's clock
# and gates it. Builds (unless BIN names prebuilt binaries that run here), then:
#   1. engine_throughput_bench --records: the calibration sweep's per-step records (~1 min);
#   2. twinstep-cost-fit: the NNLS fit, written as $OUT/h200_gemma4_12b_cost.json (to be
#      committed as perf/h200_gemma4_12b_cost.json);
#   3. sim_replay_gate with that calibration: the mixed workload on the CUDA engine and the
#      sim, per-step median / p95 error (<= 10% / <= 25%), its steps as records;
#   4. twinstep-cost-fit --check of the calibration on the replay's own steps.
# Under $OUT, named as they are committed under perf/: h200_gemma4_12b_records.json (the sweep),
# h200_gemma4_12b_cost.json (the fit), h200_gemma4_12b_replay.json (the gate's steps), run.log.
# The fit must carry the sweep's decode launch (split slots, graph buckets: the critical-path
# terms); a calibration without one is refused here.
# Provenance: TWINSTEP_GIT_REV and TWINSTEP_KERNELS_SHA256 (of the source the binaries were
# built from) are passed in by the caller when the binaries were built elsewhere.
set -o pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"  # one log (the call brings back at most 8 files)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$LOG"
targets="engine_throughput_bench sim_replay_gate twinstep-cost-fit"
usable() { [ -n "$1" ] && [ -x "$1/twinstep-cost-fit" ] && "$1/twinstep-cost-fit" --help > /dev/null &&
  ! ldd "$1/engine_throughput_bench" | grep -q "not found"; }
if ! usable "${BIN:-}"; then
  echo "building $targets (BIN=${BIN:-unset} not usable here)"
  cmake --preset gpu-gates -B build/h-cal > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build build/h-cal -j16 --target $targets > "$OUT/build.log" 2>&1 ||
    { grep -m 30 -E "error" "$OUT/build.log"; exit 1; }
  BIN=build/h-cal/bin
  export TWINSTEP_GIT_REV=${TWINSTEP_GIT_REV:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
fi
export TWINSTEP_KERNELS_SHA256=${TWINSTEP_KERNELS_SHA256:-$(cat kernels/*.cu kernels/*.cuh kernels/*.cc kernels/*.h | sha256sum | cut -c1-16)}
export TWINSTEP_KERNELS=${TWINSTEP_KERNELS:-"prefill: cuDNN paged SDPA for the local layers' seqs of >= 16 rows (plans built before the pools), attention_prefill_tc for the rest (two-warpgroup wgmma: pair at head_dim 256, split dims at 512); decode-only steps: attention_decode_split v4 (per-thread copy cursor) inside CUDA graph replays (a bucket's graph in 4 pieces); GEMMs: cuBLASLt plans tuned at startup, the streamed few-row GEMM for 9..16 rows"}
echo "git rev $TWINSTEP_GIT_REV, kernels sha256 $TWINSTEP_KERNELS_SHA256" | tee -a "$LOG"

RECORDS="$OUT/h200_gemma4_12b_records.json"
REPLAY="$OUT/h200_gemma4_12b_replay.json"
timeout ${RECORDS_TIMEOUT:-240} "$BIN/engine_throughput_bench" --records "$RECORDS" 2>&1 |
  tee -a "$LOG" || echo "records sweep failed; fitting what it wrote"
[ -f "$RECORDS" ] || exit 1
"$BIN/twinstep-cost-fit" --records "$RECORDS" --out "$OUT/h200_gemma4_12b_cost.json" 2>&1 |
  tee -a "$LOG" || { echo "fit failed"; exit 1; }
grep -q '"split_slots"' "$OUT/h200_gemma4_12b_cost.json" ||
  { echo "the fit has no decode_launch (records from a bench before the critical-path terms?)" | tee -a "$LOG"; exit 1; }
TWINSTEP_COST_MODEL="$OUT/h200_gemma4_12b_cost.json" TWINSTEP_REPLAY_RECORDS="$REPLAY" \
  timeout ${GATE_TIMEOUT:-120} "$BIN/sim_replay_gate" 2>&1 | tee -a "$LOG"
rc=$?
if [ -f "$REPLAY" ]; then
  echo "== the calibration on the replay's own steps" | tee -a "$LOG"
  "$BIN/twinstep-cost-fit" --records "$REPLAY" --check "$OUT/h200_gemma4_12b_cost.json" 2>&1 |
    tee -a "$LOG" | tail -12
fi
grep -E "\[gate\] per-step|OK \]|FAILED|PASSED" "$LOG"
exit $rc
