#!/usr/bin/env bash
# The soak run (ctest label `soak`, not part of the default `sim` run): SEEDS campaign seeds
# split into SHARDS contiguous ranges, one twinstep-sim process per shard so every core works,
# each printing its campaign summary and coverage marks. Fails when any shard finds a
# violation (its replay line is printed) or leaves a coverage mark unhit.
# Usage: twinstep_sim_soak.sh SIM_BIN [SEEDS=100000] [SHARDS=0: one per core] [LOG_DIR=.]
set -u
sim="$1" seeds="${2:-100000}" shards="${3:-0}" logs="${4:-.}"
[ "$shards" -gt 0 ] || shards=$(nproc)
mkdir -p "$logs"
per=$(((seeds + shards - 1) / shards))
start=$(date +%s)
pids=()
for ((i = 0; i < shards; i++)); do
  first=$((1 + i * per))
  count=$((seeds - i * per < per ? seeds - i * per : per))
  "$sim" --no-progress --first-seed "$first" --seeds "$count" >"$logs/soak_shard_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < shards; i++)); do
  wait "${pids[$i]}" || status=1
done
wall=$(($(date +%s) - start))
violations=0
for ((i = 0; i < shards; i++)); do
  echo "---- shard $i: $(sed -n 1p "$logs/soak_shard_$i.log")"
  sed -n '/^== campaign summary/,$p' "$logs/soak_shard_$i.log"
  grep -E 'VIOLATION|replay' "$logs/soak_shard_$i.log" | head -5
  violations=$((violations + $(grep -c 'VIOLATION' "$logs/soak_shard_$i.log")))
done
echo "soak: $seeds seeds in $shards shards, wall ${wall} s, $violations violating seed(s)"
exit "$status"
