#!/usr/bin/env bash
# spindle-plan --compare's memory column (docs/spec/cli.md): `memory` is the
# busiest device's peak as the plan counts it, which is how spindle-run
# holds it (the optimizer state sharded by default, ZeRO-1).
#
# Usage: compare_memory.sh BIN_DIR SOURCE_DIR WORK_DIR
#  - multitask-clip-7 on eight 50 GiB devices, counted sharded (the
#    default): Spindle's row reads 47.1 GiB (the figure test_planner
#    checks by hand) and says spindle-run would refuse it on GPUs (it
#    would hold 68.4 GiB), and task-level's row is over memory;
#  - tiny-lm counted replicated: no row needs less than counted sharded,
#    and the sequential row (every MetaOp on all 4 devices) needs more;
#    the state column reads the state asked for;
#  - auto (the default) chooses per strategy, and the column says which.
set -uo pipefail
bin=$1 src=$2 work=$3/compare-memory
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
plan=$bin/spindle-plan models=$src/configs/models

"$plan" "$models/multitask-clip-7.yaml" --cluster "$src/test/data/clusters/a800-1x8-50gib.yaml" --compare \
  -o sharded.json > sharded.txt 2> sharded.err || fail "multitask-clip-7 --compare: exit $?: $(cat sharded.err)"
grep -Eq '^strategy +iteration_ms .* barrier_ms +memory +state +plan_ms$' sharded.txt || fail "no memory column"
grep -Eq '^spindle +([^ ]+ +){6}47\.1 GiB +sharded +[0-9.]+  refused on GPUs: device [0-9]+ would hold 68\.[0-9]+ GiB as spindle-run runs it$' sharded.txt ||
  fail "spindle's row does not read 47.1 GiB, sharded: $(grep '^spindle' sharded.txt)"
grep -Eq '^task-level .* over memory: ' sharded.txt || fail "task-level's row is not over memory"
[ ! -s sharded.err ] || fail "spindle-plan warned: $(cat sharded.err)"

# The memory column of each strategy row, in bytes (KiB/MiB/GiB).
memory_by_row() {
  awk '/^(sequential|task-level|intra-task|spindle) / {
         v = $8; u = $9; m = (u == "KiB") ? 1024 : (u == "MiB") ? 1048576 : (u == "GiB") ? 1073741824 : 1
         printf "%s %.0f\n", $1, v * m }' "$1"
}
for state in sharded replicated; do
  "$plan" "$models/tiny-lm.yaml" --cluster "$src/configs/clusters/cpu-1x4.yaml" --optimizer-state "$state" \
    --compare -o "tiny-$state.json" > "tiny-$state.txt" 2> "tiny-$state.err" || fail "tiny-lm $state --compare: exit $?"
  memory_by_row "tiny-$state.txt" > "tiny-$state.mem"
  # Every row holds the state asked for, and says so.
  awk -v s="$state" '/^(sequential|task-level|intra-task|spindle) / && $10 != s { bad = 1 } END { exit bad }' \
    "tiny-$state.txt" || fail "tiny-lm $state: a row's state column is not $state: $(cat "tiny-$state.txt")"
done
# auto chooses per strategy: on multitask-clip-10, a800-4x8, every plan fits
# replicated, and the sequential one simulates faster sharded.
"$plan" "$models/multitask-clip-10.yaml" --cluster "$src/configs/clusters/a800-4x8.yaml" --compare -o auto.json \
  > auto.txt 2> auto.err || fail "multitask-clip-10 --compare: exit $?: $(cat auto.err)"
grep -Eq '^sequential +([^ ]+ +){6}[0-9.]+ GiB +sharded ' auto.txt || fail "auto: sequential not sharded: $(cat auto.txt)"
grep -Eq '^spindle +([^ ]+ +){6}[0-9.]+ GiB +replicated ' auto.txt || fail "auto: spindle not replicated: $(cat auto.txt)"
rows=$(wc -l < tiny-replicated.mem)
[ "$rows" -eq 4 ] || fail "expected 4 strategy rows, found $rows: $(cat tiny-replicated.txt)"
while read -r name bytes; do
  sharded=$(awk -v n="$name" '$1 == n { print $2 }' tiny-sharded.mem)
  [ -n "$sharded" ] || { fail "$name: no sharded row"; continue; }
  [ "$bytes" -ge "$sharded" ] || fail "$name: replicated $bytes bytes < sharded $sharded"
  [ "$name" != sequential ] || [ "$bytes" -gt "$sharded" ] || fail "sequential: replicated not above sharded"
done < tiny-replicated.mem

[ "$failures" -eq 0 ] && echo "compare_memory: all checks passed"
exit $((failures > 0))
