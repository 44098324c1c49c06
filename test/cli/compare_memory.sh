#!/usr/bin/env bash
# spindle-plan --compare's memory columns (docs/spec/cli.md): `memory` is
# the busiest device's peak as the plan counts it, `as_run` as spindle-run
# holds it.
#
# Usage: compare_memory.sh BIN_DIR SOURCE_DIR WORK_DIR
#  - multitask-clip-7 on eight 50 GiB devices, counted sharded (the
#    default): Spindle's row reads 47.1 GiB and 51.3 GiB (the figures
#    test_planner checks by hand), and task-level's row is over memory;
#  - tiny-lm counted replicated: the two columns agree on every row.
set -uo pipefail
bin=$1 src=$2 work=$3/compare-memory
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
plan=$bin/spindle-plan models=$src/configs/models

"$plan" "$models/multitask-clip-7.yaml" --cluster "$src/test/data/clusters/a800-1x8-50gib.yaml" --compare \
  -o sharded.json > sharded.txt 2> sharded.err || fail "multitask-clip-7 --compare: exit $?: $(cat sharded.err)"
grep -Eq '^strategy +iteration_ms .* barrier_ms +memory +as_run +plan_ms$' sharded.txt || fail "no memory columns"
grep -Eq '^spindle +([^ ]+ +){6}47\.1 GiB +51\.3 GiB +[0-9.]+$' sharded.txt ||
  fail "spindle's row does not read 47.1 GiB and 51.3 GiB: $(grep '^spindle' sharded.txt)"
grep -Eq '^task-level .* over memory: ' sharded.txt || fail "task-level's row is not over memory"

"$plan" "$models/tiny-lm.yaml" --cluster "$src/configs/clusters/cpu-1x4.yaml" --optimizer-state replicated \
  --compare -o replicated.json > replicated.txt 2> replicated.err || fail "tiny-lm --compare: exit $?"
rows=$(grep -cE '^(sequential|task-level|intra-task|spindle) ' replicated.txt)
[ "$rows" -eq 4 ] || fail "expected 4 strategy rows, found $rows"
same=$(grep -cE '^(sequential|task-level|intra-task|spindle) +([^ ]+ +){6}([0-9.]+ [KMG]iB) +\3 ' replicated.txt)
[ "$same" -eq 4 ] || fail "replicated: memory and as_run differ: $(cat replicated.txt | head -5)"

[ "$failures" -eq 0 ] && echo "compare_memory: all checks passed"
exit $((failures > 0))
