#!/usr/bin/env bash
# Hostile command lines (a red-team pass and a second pass of our own): each case
# must exit with the stated code, say the stated things on stderr, and leave
# every file and device it was pointed at as it was.
#
# Usage: hostile.sh MODE BIN_DIR SOURCE_DIR WORK_DIR [MPIEXEC]
#   MODE: outputs | check-cluster | profile-mismatch | run-flags | run-paths | run-owner
set -u
mode="$1"; bin="$2"; src="$3"; work="$4/$1"; mpiexec="${5:-mpirun}"
plan="$bin/spindle-plan"; profile="$bin/spindle-profile"; run="$bin/spindle-run"
models="$src/configs/models"; clusters="$src/configs/clusters"
rm -rf "$work"; mkdir -p "$work"; cd "$work" || exit 1
failures=0

# expect CODE FRAGMENT -- COMMAND...: exit code CODE and FRAGMENT on stderr.
expect() {
  local code="$1" fragment="$2"; shift 3
  "$@" >"$work/out.txt" 2>"$work/err.txt"
  local rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: exit $rc, expected $code: $*"; sed 's/^/  /' "$work/err.txt" | head -5; failures=$((failures + 1))
  elif [ -n "$fragment" ] && ! grep -qF -- "$fragment" "$work/err.txt"; then
    echo "FAIL: stderr lacks '$fragment': $*"; sed 's/^/  /' "$work/err.txt" | head -5; failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}
same() {  # same FILE CONTENT
  if [ "$(cat "$1")" != "$2" ]; then echo "FAIL: $1 changed"; failures=$((failures + 1)); fi
}
mpi() { "$mpiexec" --oversubscribe -np "$1" "${@:2}"; }
# understated PLAN OUT: PLAN (tiny-clip on 2 devices) for devices of 2 MiB,
# its own memory figures edited to 1000 bytes a device (it holds 2.3 MiB).
understated() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
p["cluster"]["memory_bytes"] = 2 * 1024 * 1024
p["predicted"]["memory_bytes"] = [1000, 1000]
json.dump(p, open(sys.argv[2], "w"))
EOF
}

case "$mode" in
outputs)
  cp "$models/tiny-clip.yaml" model.yaml
  cp "$clusters/cpu-1x4.yaml" cluster.yaml
  before="$(cat model.yaml)"
  expect 2 "-o /dev/null: is a device node" -- "$plan" model.yaml --cluster cluster.yaml -o /dev/null
  [ -c /dev/null ] || { echo "FAIL: /dev/null is no longer a device"; failures=$((failures + 1)); }
  expect 2 "--trace /dev/null: is a device node" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --trace /dev/null
  expect 2 "-o model.yaml: is the input model.yaml" -- "$plan" model.yaml --cluster cluster.yaml -o model.yaml
  same model.yaml "$before"
  expect 2 "is the input" -- "$plan" model.yaml --cluster cluster.yaml -o ./cluster.yaml
  expect 2 "--trace model.yaml: is the input" -- "$plan" model.yaml --cluster cluster.yaml --trace model.yaml
  same model.yaml "$before"
  expect 2 "the same file as another output" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --trace ./p.json
  mkdir adir
  expect 2 "-o adir: is a directory" -- "$plan" model.yaml --cluster cluster.yaml -o adir
  echo precious > target.json; ln -s target.json link.json
  expect 2 "-o link.json: is a symbolic link" -- "$plan" model.yaml --cluster cluster.yaml -o link.json
  [ -L link.json ] && same target.json precious || { echo "FAIL: link replaced"; failures=$((failures + 1)); }
  expect 2 "folder" -- "$plan" model.yaml --cluster cluster.yaml -o missing/p.json
  expect 2 "--plot model.yaml: is the input" -- "$plan" model.yaml --cluster cluster.yaml --plot model.yaml
  expect 2 "--compare-json /dev/null: is a device node" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --compare-json /dev/null
  expect 2 "--compare-json link.json: is a symbolic link" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --compare-json link.json
  expect 2 "--compare-json adir: is a directory" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --compare-json adir
  expect 2 "-o model.yaml: is the input" -- "$profile" model.yaml --cluster cluster.yaml -o model.yaml
  same model.yaml "$before"
  expect 2 "-o /dev/null: is a device node" -- "$profile" model.yaml --cluster cluster.yaml -o /dev/null
  expect 2 "-o link.json: is a symbolic link" -- "$profile" model.yaml --cluster cluster.yaml -o link.json
  # An unreadable input that never ends is refused, not read forever.
  expect 2 "larger than" -- "$plan" /dev/zero --cluster cluster.yaml -o p.json
  # An empty path ("--trace $UNSET" in a script) is refused, not read as
  # the option left out; nothing is planned or written.
  for opt in -o --trace --plot --compare-json --lower; do
    expect 2 "empty path" -- "$plan" model.yaml --cluster cluster.yaml "$opt" ""
  done
  expect 2 "--output: empty path" -- "$profile" model.yaml --cluster cluster.yaml --analytic -o ""
  # --devices: given, it must list counts ("$COUNTS" unset is not "every count").
  expect 2 "--devices: empty value" -- "$profile" model.yaml --cluster cluster.yaml --analytic -o prof.json --devices ""
  for list in "2," ",2" "1,,2" "-1" "x"; do
    expect 2 "--devices: expected positive integers" -- \
      "$profile" model.yaml --cluster cluster.yaml --analytic -o prof.json --devices "$list"
  done
  expect 2 "strictly increasing" -- "$profile" model.yaml --cluster cluster.yaml --analytic -o prof.json --devices 2,1
  expect 2 "outside 1..4" -- "$profile" model.yaml --cluster cluster.yaml --analytic -o prof.json --devices 8
  [ -e prof.json ] && { echo "FAIL: prof.json written by a refused --devices"; failures=$((failures + 1)); }
  expect 0 "" -- "$profile" model.yaml --cluster cluster.yaml --analytic -o prof.json --devices 1,2
  counts=$(python3 -c "import json, sys; print(sorted({p['devices'] for e in json.load(open(sys.argv[1]))['entries'] for p in e['points']}))" prof.json)
  [ "$counts" = "[1, 2]" ] ||
    { echo "FAIL: --devices 1,2 profiled the counts $counts"; failures=$((failures + 1)); }
  rm -f prof.json
  # --lower into a folder holding a larger plan's programs: refused before
  # anything is written (the stale device-2/3.json would read as part of
  # the new plan); the same device count again overwrites.
  "$plan" model.yaml --cluster cluster.yaml -o four.json --lower programs >/dev/null || exit 1
  sed 's/^name: .*/name: cpu-1x2/; s/^devices_per_island: .*/devices_per_island: 2/' cluster.yaml > two.yaml
  expect 2 "holds device-2.json .. device-3.json (2 files), programs of a plan for more than 2 devices" -- \
    "$plan" model.yaml --cluster two.yaml -o two.json --lower programs
  [ -e two.json ] && { echo "FAIL: two.json written by a refused --lower"; failures=$((failures + 1)); }
  expect 0 "" -- "$plan" model.yaml --cluster two.yaml -o two.json
  expect 2 "holds device-2.json .. device-3.json" -- "$plan" model.yaml --check two.json --lower programs
  expect 0 "" -- "$plan" model.yaml --check four.json --lower programs
  # A file lower never writes (a leading 0) is not taken for one of its
  # programs: it refused the folder, naming device-4.json, which did not exist.
  mkdir -p mine && echo '{}' > mine/device-04.json
  expect 0 "" -- "$plan" model.yaml --check two.json --lower mine
  same mine/device-04.json '{}'
  rm two.json
  # No other output or input may be one of the programs --lower writes, or
  # the folder itself: the plan would be replaced by device 0's program,
  # exit 0 (or written, then --lower fail to make its folder, exit 1).
  expect 2 "-o new.json: is the folder of --lower new.json; name another file" -- \
    "$plan" model.yaml --cluster cluster.yaml -o new.json --lower new.json
  [ -e new.json ] && { echo "FAIL: new.json written by a refused --lower"; failures=$((failures + 1)); }
  expect 2 "-o programs/device-0.json: is in the folder of --lower programs, where device-0.json is a device's program" \
    -- "$plan" model.yaml --cluster cluster.yaml -o programs/device-0.json --lower programs
  expect 2 "--trace programs/./device-3.json: is in the folder of --lower programs" -- \
    "$plan" model.yaml --cluster cluster.yaml -o four.json --trace programs/./device-3.json --lower programs
  cp four.json programs/device-1.json
  expect 2 "the input programs/device-1.json is in the folder of --lower programs" -- \
    "$plan" model.yaml --check programs/device-1.json --lower programs
  cmp -s four.json programs/device-1.json || { echo "FAIL: the checked plan was replaced"; failures=$((failures + 1)); }
  rm programs/device-1.json
  expect 0 "" -- "$plan" model.yaml --cluster cluster.yaml -o programs/plan.json --lower programs
  [ -e programs/plan.json ] && [ -e programs/device-3.json ] ||
    { echo "FAIL: a plan beside its programs was not written"; failures=$((failures + 1)); }
  # A program's name taken by a folder: refused before planning. A --lower
  # folder that cannot be made (under /proc; as root the access check
  # passes and mkdir fails after planning): no output at all, the plan that
  # was there kept (before 2026-12-06 the plan and trace were written, then
  # the run failed).
  echo "earlier plan" > kept.json
  mkdir -p taken/device-1.json
  expect 2 "--lower taken: device-1.json is not a regular file (a folder), where this plan's program goes" -- \
    "$plan" model.yaml --cluster cluster.yaml -o kept.json --trace kept-trace.json --lower taken
  "$plan" model.yaml --cluster cluster.yaml -o kept.json --trace kept-trace.json --lower /proc/spindle-no/programs \
    >out.txt 2>err.txt
  rc=$?
  if [ "$rc" -ne 1 ] && [ "$rc" -ne 2 ]; then echo "FAIL: --lower under /proc: exit $rc"; failures=$((failures + 1)); fi
  grep -qF -- "--lower /proc/spindle-no/programs: " err.txt || { echo "FAIL: --lower under /proc: no error naming it"; failures=$((failures + 1)); }
  same kept.json "earlier plan"
  [ -e kept-trace.json ] && { echo "FAIL: a trace written by a failed --lower"; failures=$((failures + 1)); }
  [ -e taken/device-0.json ] && { echo "FAIL: a program written by a refused --lower"; failures=$((failures + 1)); }
  rm -rf kept.json taken
  # Nothing was written by any refusal; a good run still writes.
  ls *.tmp.* >/dev/null 2>&1 && { echo "FAIL: temporary file left"; failures=$((failures + 1)); }
  [ -e p.json ] && { echo "FAIL: p.json written by a refused run"; failures=$((failures + 1)); }
  expect 0 "" -- "$plan" model.yaml --cluster cluster.yaml -o p.json --trace t.json
  # A usage error that CLI11 finds reads as the programs' own errors:
  # "PROGRAM: error: MESSAGE", then the hint to --help.
  expect 2 "spindle-plan: error: --shift-simulations: expected an integer from 0 to 1048576, found 'abc'" -- \
    "$plan" model.yaml --cluster cluster.yaml --shift-simulations abc
  expect 2 "spindle-profile: error: MODEL is required" -- "$profile"
  for threads in 0 -1 abc "" 2.5 1025 " 1" +1 "1 "; do
    expect 2 "spindle-plan: error: SPINDLE_PLAN_THREADS=$threads: expected a number of threads from 1 to 1024" -- \
      env SPINDLE_PLAN_THREADS="$threads" "$plan" model.yaml --cluster cluster.yaml -o e.json
    expect 2 "spindle-profile: error: SPINDLE_PLAN_THREADS=$threads: expected a number of threads from 1 to 1024" -- \
      env SPINDLE_PLAN_THREADS="$threads" "$profile" model.yaml --cluster cluster.yaml -o e.json
  done
  [ -e e.json ] && { echo "FAIL: e.json written under a refused SPINDLE_PLAN_THREADS"; failures=$((failures + 1)); }
  expect 0 "" -- env SPINDLE_PLAN_THREADS=1 "$plan" model.yaml --cluster cluster.yaml -o one-thread.json
  cmp -s one-thread.json p.json || { echo "FAIL: the plan on 1 thread differs"; failures=$((failures + 1)); }
  # The summary says how many threads planned (its planning time depends on it).
  grep -Eq '^planning  [0-9.]+ ms on 1 thread$' "$work/out.txt" ||
    { echo "FAIL: no 'planning ... on 1 thread' line: $(grep '^planning' "$work/out.txt")"; failures=$((failures + 1)); }
  env SPINDLE_PLAN_THREADS=3 "$plan" model.yaml --cluster cluster.yaml -o three-threads.json > three.txt 2>&1
  grep -Eq '^planning  [0-9.]+ ms on 3 threads$' three.txt ||
    { echo "FAIL: no 'planning ... on 3 threads' line: $(grep '^planning' three.txt)"; failures=$((failures + 1)); }
  cmp -s three-threads.json p.json || { echo "FAIL: the plan on 3 threads differs"; failures=$((failures + 1)); }
  for opt in --bucket-mb --strategy; do
    expect 2 "spindle-plan: error: $opt: empty value" -- "$plan" model.yaml --cluster cluster.yaml -o e.json "$opt" ""
  done
  expect 2 "spindle-profile: error: --point-ms: empty value" -- \
    "$profile" model.yaml --cluster cluster.yaml --measure -o e.json --point-ms ""
  [ -e e.json ] && { echo "FAIL: e.json written by a refused run"; failures=$((failures + 1)); }
  if [ -x "$bin/spindle-export" ]; then
    expect 2 "spindle-export: error: checkpoint is required" -- "$bin/spindle-export"
  fi
  # Standard output that cannot be written (a full disk) is a failure, not
  # exit 0 with the summary lost.
  if [ -w /dev/full ]; then
    expect 1 "spindle-plan: error: writing standard output: No space left on device" -- \
      bash -c '"$@" > /dev/full' bash "$plan" model.yaml --cluster cluster.yaml -o full.json
    expect 1 "spindle-profile: error: writing standard output" -- \
      bash -c '"$@" > /dev/full' bash "$profile" model.yaml --cluster cluster.yaml --analytic -o full-profile.json
    expect 1 "spindle-plan: error: writing standard output" -- bash -c '"$@" > /dev/full' bash "$plan" --help
  fi
  ;;
check-cluster)
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" -o two.json >/dev/null || exit 1
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --check two.json --cluster "$clusters/cpu-1x2.yaml"
  # --check plans nothing: what only planning reads is refused, not ignored.
  for opt in "-o x.json" "--trace t.json" "--plot p.svg" "--compare" "--compare-json c.json" "--strategy sequential" \
             "--placement sequential" "--shift-simulations 3" "--accept-profile-mismatch"; do
    # shellcheck disable=SC2086  # each case is a flag and its value
    expect 2 "excludes" -- "$plan" "$models/tiny-clip.yaml" --check two.json $opt
  done
  for f in x.json t.json p.svg c.json; do
    [ -e "$f" ] && { echo "FAIL: $f written by a refused --check"; failures=$((failures + 1)); }
  done
  expect 2 "cluster.devices: the plan is for 2 devices, cluster 'cpu-1x4' has 4" -- \
    "$plan" "$models/tiny-clip.yaml" --check two.json --cluster "$clusters/cpu-1x4.yaml"
  # An island size that does not divide the device count.
  python3 - two.json <<'EOF'
import json, sys
p = json.load(open(sys.argv[1])); p["cluster"]["devices_per_island"] = 3
json.dump(p, open("islands.json", "w"))
p = json.load(open(sys.argv[1])); p["predicted"]["memory_bytes"] = [-1, -1]
json.dump(p, open("negative.json", "w"))
EOF
  expect 2 "cluster.devices_per_island: 3 does not divide the 2 devices" -- \
    "$plan" "$models/tiny-clip.yaml" --check islands.json
  expect 2 "predicted.memory_bytes[0]: expected a byte count >= 0" -- \
    "$plan" "$models/tiny-clip.yaml" --check negative.json
  # A plan whose own memory figures understate it (edited by hand: devices
  # of 2 MiB, 1000 bytes counted on each, 4.75 MiB held on the CPU backend):
  # valid by its own figures, but costed again from the model spindle-run
  # would refuse it, and --check says so (it said only "valid").
  understated two.json liar.json
  expect 0 "spindle-plan: warning: spindle-run on the CPU backend would refuse it: liar.json: device 0 would hold 5.0" -- \
    "$plan" "$models/tiny-clip.yaml" --check liar.json
  grep -q "of 2.00 MiB: the plan counts 1000 B there" err.txt ||
    { echo "FAIL: --check does not say what the plan counts"; sed 's/^/  /' err.txt; failures=$((failures + 1)); }
  # A plan that fits as run draws no warning.
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --check two.json
  grep -q warning err.txt && { echo "FAIL: a warning for a plan that fits"; failures=$((failures + 1)); }
  # Flags that would be taken and do nothing (exit 0, the same output) are
  # refused: lowering flags with --check but no --lower, boundary shifts
  # for a baseline's plan, a mismatch accepted with no profile.
  for flag in "--bucket-mb 1" --no-overlap --no-early-transfers --grad-norm; do
    # shellcheck disable=SC2086  # a flag and its value
    expect 2 "${flag%% *}: with --check it shapes the programs --lower DIR writes, and there is no --lower" -- \
      "$plan" "$models/tiny-clip.yaml" --check two.json $flag
  done
  expect 2 "--shift-simulations: shifts Spindle's plans, not --strategy sequential's" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --strategy sequential --shift-simulations 5 -o x.json
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --strategy sequential --compare \
    --shift-simulations 5 -o x.json
  expect 2 "--accept-profile-mismatch: accepts a mismatch of --profile, and there is none" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --accept-profile-mismatch -o y.json
  [ -e y.json ] && { echo "FAIL: y.json written by a refused plan"; failures=$((failures + 1)); }
  # A MetaOp's level is its MetaLevel, not any number above its inputs'
  # (a level of 50 passed).
  python3 - two.json <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
last = p["metaops"][-1]
last["level"] += 50
json.dump(p, open("level.json", "w"))
print(last["id"], last["level"] - 50, file=open("level.txt", "w"))
EOF
  read -r id level < level.txt
  expect 2 "metaops[$id].level: $((level + 50)), but its MetaLevel (the longest path to it from a MetaOp without inputs) is $level" -- \
    "$plan" "$models/tiny-clip.yaml" --check level.json
  ;;
profile-mismatch)
  "$profile" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" -o p2.json >/dev/null || exit 1
  grep -q '"x-cluster": {"devices":2,"devices_per_island":2,"name":"cpu-1x2"}' p2.json ||
    { echo "FAIL: the profile does not record its cluster"; failures=$((failures + 1)); }
  expect 2 "cluster.devices: the profile was made for 2 devices" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x4.yaml" --profile p2.json -o p.json
  [ -e p.json ] && { echo "FAIL: p.json written"; failures=$((failures + 1)); }
  expect 2 "device: the profile was made for \"cpu-core\"" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/a800-1x8.yaml" --profile p2.json -o p.json
  expect 0 "warning" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x4.yaml" --profile p2.json \
    -o p.json --accept-profile-mismatch
  # The files of earlier builds stay readable: version 3 ("cluster",
  # "comm_overhead" without the x-), version 2 (no comm_overhead), version
  # 1 of the first builds (no cluster either).
  sed -e 's/"version": 1,/"version": 3,/' -e 's/"x-cluster":/"cluster":/' -e 's/"x-comm_overhead":/"comm_overhead":/' \
      p2.json > v3.json
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --profile v3.json -o p1.json
  grep -v '"comm_overhead":' v3.json | sed 's/"version": 3/"version": 2/' > v2.json
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --profile v2.json -o p1.json
  grep -v -e '"x-cluster":' -e '"x-comm_overhead":' p2.json > v1.json
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --profile v1.json -o p1.json
  # A profile of the same model in another dtype (its param_bytes half the
  # model's) or another tensor_parallel (points at counts the module cannot
  # run on; the keys hold no tensor_parallel): both planned before, exit 0
  # and no word, with the memory and times of the other model.
  sed 's/^dtype: fp32/dtype: bf16/' "$models/tiny-clip.yaml" > bf16.yaml
  "$profile" bf16.yaml --cluster "$clusters/cpu-1x2.yaml" -o bf16.json >/dev/null || exit 1
  rm -f p.json
  expect 2 "param_bytes 4224, but in model 'tiny-clip' (dtype fp32) the operator holds 8448: a profile for another dtype or model?" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --profile bf16.json -o p.json
  [ -e p.json ] && { echo "FAIL: p.json written"; failures=$((failures + 1)); }
  "$profile" "$models/tiny-lm.yaml" --cluster "$clusters/cpu-1x4.yaml" -o tp2.json >/dev/null || exit 1
  sed 's/tensor_parallel: 2/tensor_parallel: 4/' "$models/tiny-lm.yaml" > tp4.yaml
  grep -q 'tensor_parallel: 4' tp4.yaml || { echo "FAIL: tp4.yaml has no tensor_parallel 4"; failures=$((failures + 1)); }
  expect 2 "a point at 2 devices, which its module (tensor_parallel 4, batch 24) cannot run on: a profile for another tensor_parallel?" -- \
    "$plan" tp4.yaml --cluster "$clusters/cpu-1x4.yaml" --profile tp2.json -o p.json
  expect 0 "warning" -- "$plan" tp4.yaml --cluster "$clusters/cpu-1x4.yaml" --profile tp2.json -o p.json \
    --accept-profile-mismatch
  # A profile of 1 and 2 devices planned on 4: planned, but said, since its
  # curves are flat beyond 2 (no MetaOp is spread wider); none for a
  # profile of every count.
  "$profile" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x4.yaml" --devices 1,2 -o short.json >/dev/null || exit 1
  expect 0 "warning: short.json: 17 of the entries this model uses stop below the device counts" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x4.yaml" --profile short.json -o p.json
  grep -qF "points up to 2 devices, 4 valid" "$work/err.txt" ||
    { echo "FAIL: the short profile's warning names no entry"; failures=$((failures + 1)); }
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x4.yaml" --profile "$src/profiles/tiny-clip.cpu-1x4.json" -o p.json
  grep -q warning "$work/err.txt" && { echo "FAIL: a warning for a profile of every count"; failures=$((failures + 1)); }
  ;;
run-flags)
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o one.json >/dev/null || exit 1
  # A bf16 model on devices of 2 MiB: its plan counts 1.4 MiB a device, the
  # activations in bf16 without the attention probabilities and outputs;
  # spindle-run keeps them in fp32 with those (5.0 MiB on the CPU backend):
  # said by spindle-plan, refused by spindle-run before it allocates (it
  # trained past the device's memory before).
  sed 's/^dtype: fp32/dtype: bf16/' "$models/tiny-clip.yaml" > bf16.yaml
  sed 's/memory_gib: 4$/memory_gib: 0.001953125/' "$clusters/cpu-1x2.yaml" > small.yaml
  expect 0 "" -- "$plan" bf16.yaml --cluster small.yaml -o bf16.json
  grep -q "^run mem   as spindle-run holds it (activations in fp32, not bf16, .*): peak 5.0 MiB on the CPU backend, 3.2 MiB on GPUs over NCCL (of 2.0 MiB); over the device's memory: spindle-run refuses the plan there" out.txt ||
    { echo "FAIL: spindle-plan does not say what spindle-run holds"; cat out.txt; failures=$((failures + 1)); }
  expect 2 "bf16.json: device 0 would hold 5.04 MiB of 2.00 MiB: the plan counts 1.44 MiB there, with the activations in bf16, which spindle-run keeps in fp32, and without the attention probabilities, the operators' outputs and the backward pass's working set, which spindle-run holds too; plan again on more devices" -- \
    mpi 2 "$run" bf16.json --model bf16.yaml --steps 1
  grep -q -- "--bucket-mb" err.txt && { echo "FAIL: --bucket-mb advised without NCCL"; failures=$((failures + 1)); }
  # A plan whose own memory figures understate it (edited by hand) is
  # costed again from the model: refused (it trained past the devices'
  # memory).
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" -o two.json >/dev/null || exit 1
  understated two.json liar.json
  expect 2 "liar.json: device 0 would hold 5.0" -- mpi 2 "$run" liar.json --model "$models/tiny-clip.yaml" --steps 1
  # A usage error that CLI11 finds, on every rank: said once (the launcher's
  # rank 0 speaks for all), as "spindle-run: error: ...".
  expect 2 "spindle-run: error: Could not convert: --lr = x" -- \
    mpi 2 "$run" one.json --model "$models/tiny-clip.yaml" --lr x
  [ "$(grep -c 'error:' "$work/err.txt")" -eq 1 ] ||
    { echo "FAIL: a usage error said $(grep -c 'error:' "$work/err.txt") times, not once"; failures=$((failures + 1)); }
  # So is a number out of range, checked before MPI starts (main).
  expect 2 "spindle-run: error: --lr 2: expected a learning rate above 0 and at most 1" -- \
    mpi 2 "$run" one.json --model "$models/tiny-clip.yaml" --lr 2
  [ "$(grep -c 'error:' "$work/err.txt")" -eq 1 ] ||
    { echo "FAIL: a refused number said $(grep -c 'error:' "$work/err.txt") times, not once"; failures=$((failures + 1)); }
  # An empty value ("--clip-grad $CLIP", CLIP unset) is refused, not read
  # as 0: that run would train unclipped, or with no weight decay.
  for opt in --clip-grad --weight-decay --lr --steps --adam-eps --seed; do
    expect 2 "spindle-run: error: $opt: empty value (an unset variable in a script?)" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" "$opt" "" --metrics m.jsonl
  done
  [ -e m.jsonl ] && { echo "FAIL: m.jsonl written by a refused run"; failures=$((failures + 1)); }
  # Each value echoed as the shortest decimal that reads back (number_text):
  # not 1e30 as 31 digits and six decimals, nor a tiny value as 0.000000.
  for lr in nan:nan inf:inf -1:-1 0:0 1e30:1e+30 1.5:1.5; do
    expect 2 "--lr ${lr#*:}: expected a learning rate above 0 and at most 1" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --lr "${lr%%:*}" --metrics m.jsonl
  done
  # The learning-rate schedule: a floor with nothing that decays (careless),
  # a decay no longer than the warm-up (--steps 10 its default length), a
  # floor above the peak, a negative count (not CLI11's 309-digit range).
  expect 2 "--min-lr has no effect with --lr-decay-style constant (the default): give --lr-decay-style linear or cosine" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --min-lr 1e-4 --metrics m.jsonl
  expect 2 "--lr-decay-steps 10 (default: --steps): cosine decay needs more steps than the warm-up (--lr-warmup-steps 20)" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --lr-decay-style cosine --lr-warmup-steps 20 --metrics m.jsonl
  expect 2 "--min-lr 0.01: expected a rate from 0 to --lr (0.003)" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --lr-decay-style linear --min-lr 0.01 --metrics m.jsonl
  expect 2 "--lr-warmup-steps: expected an integer from 0 to 2147483647, found '-1'" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --lr-warmup-steps -1 --metrics m.jsonl
  expect 2 "--exit-duration-mins -1: expected minutes above 0 and at most 1e6" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --checkpoint ck --exit-duration-mins -1 --metrics m.jsonl
  for adam in --weight-decay:-0.1 --adam-beta1:1 --adam-beta2:nan; do
    expect 2 "${adam%%:*} ${adam#*:}: expected a number from 0 to below 1" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" "${adam%%:*}" "${adam#*:}" --metrics m.jsonl
  done
  expect 2 "--adam-eps 0: expected a number above 0 and at most 1" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --adam-eps 0 --metrics m.jsonl
  # AdamW takes them as floats: below 1 or above 0 as doubles is not enough
  # (these ran with a factor of 1 or an epsilon or rate of 0, and diverged
  # or did not train, exit 0 or 1 with a misleading message).
  for f in --adam-beta1:0.99999999:1 --adam-beta2:0.99999999:1 --weight-decay:0.99999999:1 --adam-eps:1e-46:0 --lr:1e-46:0; do
    IFS=: read -r opt value as <<< "$f"
    expect 2 "$opt $value: expected a" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" "$opt" "$value" --metrics m.jsonl
    grep -qF "(as a float: it is $as there)" "$work/err.txt" ||
      { echo "FAIL: $opt $value: the float's value not said"; failures=$((failures + 1)); }
  done
  for clip in -1:-1 nan:nan; do
    expect 2 "--clip-grad ${clip#*:}: expected the largest gradient norm, a number above 0 and at most 1e30 (0: no clipping)" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --clip-grad "${clip%%:*}" --metrics m.jsonl
  done
  [ -e m.jsonl ] && { echo "FAIL: metrics written by a refused run"; failures=$((failures + 1)); }
  # Counts are decimal digits: CLI11 alone read --steps 0x10 as 16 and
  # trained (before 2026-12-06), and answered 3000000000 with "Could not
  # convert".
  for steps in 0 -5 1e30 0x10 3000000000; do
    expect 2 "--steps: expected an integer from 1 to 2147483647, found '$steps'" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps "$steps"
  done
  expect 2 "--keep: expected an integer from 1 to 2147483647, found '0'" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --checkpoint ck --keep 0
  expect 2 "--every: expected an integer from 1 to 2147483647, found '0b11'" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --checkpoint ck --every 0b11
  expect 2 "--seed: expected a decimal integer in [0, 18446744073709551615], found '-1'" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --seed -1
  expect 2 "--seed: expected a decimal integer in [0, 18446744073709551615], found '1e30'" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --seed 1e30
  # Past 2^64 - 1 (CLI11 alone saturated it to 2^64 - 1 and trained), hex.
  for seed in 18446744073709551616 99999999999999999999 0x10 " 7"; do
    expect 2 "--seed: expected a decimal integer in [0, 18446744073709551615]" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --seed "$seed"
  done
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --seed 18446744073709551615
  [ -e ck ] && { echo "FAIL: checkpoint folder made by a refused run"; failures=$((failures + 1)); }
  # Both programs check --bucket-mb with sp::check_bucket_mb: spindle-run
  # (each case an mpirun, ~2 s) with two, spindle-plan with all of them.
  for mb in nan 0; do
    expect 2 "spindle-run: error: --bucket-mb $mb: expected MiB in [0.001, 1048576]" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --bucket-mb "$mb"
  done
  # --trace-steps: FIRST:LAST, FIRST: or FIRST, steps from 1 (a typo is not
  # read as "every step"), with --trace, inside the run; nothing written.
  for ts in 0:2 5:3 x 1:y -1:2 :3 2:3:4; do
    expect 2 "--trace-steps: expected FIRST:LAST, FIRST: or FIRST" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --trace t.json --trace-steps "$ts"
  done
  expect 2 "--trace-steps requires --trace" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --trace-steps 1
  expect 2 "--trace-steps 4:9: starts after the run's last step (--steps 3)" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 3 --trace t.json --trace-steps 4:9
  [ -e t.json ] && { echo "FAIL: a trace written by a refused run"; failures=$((failures + 1)); }
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 4 --trace t.json --trace-steps 2:3
  traced=$(python3 -c "import json, sys; print(sorted({e['args']['step'] for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('ph') == 'X'}))" t.json)
  [ "$traced" = "[2, 3]" ] || { echo "FAIL: --trace-steps 2:3 traced steps $traced"; failures=$((failures + 1)); }
  # --comm-timeout (NCCL's wait): seconds above 0, finite, at most 1e6.
  for t in nan:nan inf:inf 0:0 -5:-5 1e30:1e+30; do
    expect 2 "--comm-timeout ${t#*:}: expected seconds above 0 and at most 1e6" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --comm-timeout "${t%%:*}"
  done
  expect 2 "spindle-run: error: Could not convert: --comm-timeout = x" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --comm-timeout x
  for mb in nan:nan inf:inf -1:-1 0:0 1e30:1e+30 1e-30:1e-30 0.0009:0.0009 1e-7:1e-07; do
    expect 2 "--bucket-mb ${mb#*:}: expected MiB in [0.001, 1048576]" -- \
      "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o mb.json --bucket-mb "${mb%%:*}"
  done
  expect 2 "spindle-plan: error: Could not convert: --bucket-mb = x" -- \
    "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o mb.json --bucket-mb x
  [ -e mb.json ] && { echo "FAIL: a plan written with a refused --bucket-mb"; failures=$((failures + 1)); }
  # --shift-simulations: a count from 0 to 2^20, in decimal digits (CLI11
  # alone read 0x10 as 16 and 1e3 as 1000).
  for n in -1 1e30 x 2.5 nan 2000000 0x10 1e3; do
    expect 2 "--shift-simulations: expected an integer from 0 to 1048576, found '$n'" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o sh.json \
      --shift-simulations "$n"
  done
  [ -e sh.json ] && { echo "FAIL: a plan written with a refused --shift-simulations"; failures=$((failures + 1)); }
  expect 0 "" -- "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" -o sh.json --shift-simulations 0
  [ -e sh.json ] || { echo "FAIL: no plan with --shift-simulations 0"; failures=$((failures + 1)); }
  # Careless, not hostile: a plan made with --no-overlap --bucket-mb 0.01
  # run without those flags runs what was planned (the plan's x-lowering),
  # not spindle-run's defaults: blocking all-reduces, one trace box per
  # bucket of the planned program.
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x2.yaml" --no-overlap --bucket-mb 0.01 \
    -o sync.json --lower sync-programs >/dev/null || exit 1
  expect 0 "" -- mpi 2 "$run" sync.json --model "$models/tiny-clip.yaml" --steps 1 --trace sync-trace.json
  grep -q "^spindle-run: gradient sync: rank 0 all-reduces [0-9]* buckets of at most 0.01 MiB, after the backward pass, blocking (the plan's x-lowering: planned with --no-overlap)" out.txt ||
    { echo "FAIL: no line for the plan's --no-overlap"; failures=$((failures + 1)); }
  planned=$(grep -c '"allreduce"' sync-programs/device-0.json)
  ran=$(python3 -c "import json, sys; print(sum(1 for e in json.load(open(sys.argv[1]))['traceEvents'] if e.get('name') == 'gradient sync' and e.get('pid') == 0))" sync-trace.json)
  if [ "$planned" -lt 2 ] || [ "$ran" != "$planned" ]; then
    echo "FAIL: rank 0 ran $ran bucket all-reduces, the plan's program has $planned"; failures=$((failures + 1))
  fi
  ;;
run-paths)
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o one.json >/dev/null || exit 1
  echo precious > afile
  expect 2 "--checkpoint afile: exists and is not a folder" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --checkpoint afile
  same afile precious
  # The files DATA.yaml names are inputs too: an output over one was
  # written, exit 0, and the data lost (--metrics appended to an .npy, which
  # the reader then still took).
  "$plan" "$models/digits-mm.yaml" --cluster "$clusters/cpu-1x1.yaml" -o digits.json >/dev/null || exit 1
  cp -r "$src/configs/data/digits/val" dval || exit 1
  printf 'tasks:\n  image-text: {path: dval}\n  audio-text: {path: dval}\n  caption: {path: dval}\n' > dval.yaml
  data_sum=$(cat dval/* | cksum)
  for opt in --dump-params --dump-grads --metrics --trace; do
    for data in --data --eval-data; do
      expect 2 "$opt dval/txt.npy: is the input" -- \
        mpi 1 "$run" digits.json --model "$models/digits-mm.yaml" --steps 1 "$data" dval.yaml "$opt" dval/txt.npy
    done
  done
  [ "$(cat dval/* | cksum)" = "$data_sum" ] || { echo "FAIL: the data files changed"; failures=$((failures + 1)); }
  expect 2 "--trace missing/t.json: folder" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --trace missing/t.json
  expect 2 "--metrics one.json: is the input one.json" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --metrics one.json
  expect 2 "--dump-params /dev/null: is a device node" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --dump-params /dev/null
  # Nor may an output or input be the checkpoint folder, or a name its
  # checkpoints take (saving, keeping the newest and --overwrite replace or
  # remove those).
  expect 2 "--metrics ck: is the folder of --checkpoint ck; name another file" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --checkpoint ck --metrics ck
  [ -e ck ] && { echo "FAIL: ck made by a refused run"; failures=$((failures + 1)); }
  expect 2 "--metrics adir: is a directory" -- \
    bash -c 'mkdir -p adir && exec "$@"' bash \
      "$mpiexec" --oversubscribe -np 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --metrics adir
  # An empty path: "--data $DATA" with DATA unset must not train on
  # synthetic data and exit 0.
  for opt in --data --eval-data --metrics --trace --checkpoint --dump-params --dump-grads; do
    expect 2 "$opt: empty path" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 "$opt" ""
  done
  expect 2 "empty path" -- mpi 1 "$run" "" --model "$models/tiny-clip.yaml" --steps 2
  expect 2 "--output: empty path" -- "$bin/spindle-export" ck -o ""
  if [ -w /dev/full ]; then   # a full disk: the run fails, it does not exit 0
    ln -sf /dev/full full.jsonl
    expect 2 "symbolic link" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --metrics full.jsonl
  fi
  ;;
run-owner)
  "$plan" "$models/tiny-clip.yaml" --cluster "$clusters/cpu-1x1.yaml" -o one.json >/dev/null || exit 1
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 4 --every 2 --checkpoint ck
  [ -d ck/step-000004 ] || { echo "FAIL: no checkpoint"; failures=$((failures + 1)); }
  # A fresh run into that folder is refused; --resume continues; --overwrite starts afresh.
  expect 2 "holds checkpoints of another run (step-000002 .. step-000004)" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --checkpoint ck --seed 7
  [ -d ck/step-000004 ] || { echo "FAIL: the other run's checkpoint was lost"; failures=$((failures + 1)); }
  # Resuming after step 4, a trace window that ends by then holds nothing.
  expect 2 "--trace-steps 1:4: ends at or before step 4, the checkpoint this run resumes from" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 6 --checkpoint ck --every 2 --resume \
      --trace t.json --trace-steps 1:4
  [ -e t.json ] && { echo "FAIL: a trace written by a refused resume"; failures=$((failures + 1)); }
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 6 --checkpoint ck --every 2 --resume
  [ -d ck/step-000006 ] || { echo "FAIL: resume did not save"; failures=$((failures + 1)); }
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --checkpoint ck --seed 7 --overwrite
  if [ -d ck/step-000006 ] || [ ! -d ck/step-000001 ]; then
    echo "FAIL: --overwrite left $(ls ck)"; failures=$((failures + 1))
  fi
  grep -q "removed the checkpoints of another run" out.txt || { echo "FAIL: --overwrite did not say so"; failures=$((failures + 1)); }
  # --overwrite removes checkpoints, not what only looks like one (a file
  # step-1 and a folder step-2020 were deleted, exit 0); the run's lock file
  # is no output's (a resume truncates it).
  echo mine > ck/step-1; mkdir -p ck/step-2020; echo photo > ck/step-2020/photo.jpg
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --checkpoint ck --seed 8 --overwrite
  same ck/step-1 mine
  same ck/step-2020/photo.jpg photo
  # A step folder is no folder of checkpoints: nested in it, a run's
  # checkpoints were deleted with that step (--keep, --overwrite).
  for into in ck/step-000001 ck/step-000007; do
    expect 2 "--checkpoint $into: is a checkpoint (a step folder), not a folder of checkpoints" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --checkpoint "$into"
  done
  [ -e ck/step-000007 ] && { echo "FAIL: a refused run made ck/step-000007"; failures=$((failures + 1)); }
  # --overwrite removes the other run's checkpoints at this run's first
  # save, not before it: a run that fails first (bad data at step 1; here a
  # failure inside step 1) keeps them, and leaves no empty --metrics file.
  expect 1 "rank 0: SPINDLE_TEST_THROW_AT_STEP=1" -- env SPINDLE_TEST_THROW_AT_STEP=1 "$mpiexec" --oversubscribe -np 1 \
    "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --checkpoint ck --seed 9 --overwrite --metrics fresh.jsonl
  [ -d ck/step-000001 ] || { echo "FAIL: --overwrite removed checkpoints before its first save"; failures=$((failures + 1)); }
  [ -e fresh.jsonl ] && { echo "FAIL: a run that failed in step 1 left fresh.jsonl"; failures=$((failures + 1)); }
  # Nothing to train (--steps at the checkpoint's): --dump-params writes the
  # checkpoint's parameters, --dump-grads says it has none (both were
  # skipped in silence, exit 0).
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 1 --checkpoint ck --seed 8 --resume \
    --dump-params ckp.json --dump-grads g.json
  grep -q '"steps":1' ckp.json 2>/dev/null || { echo "FAIL: --dump-params not written with nothing to train"; failures=$((failures + 1)); }
  grep -q "note: --dump-grads g.json not written: no step was trained" out.txt ||
    { echo "FAIL: --dump-grads skipped without a word"; failures=$((failures + 1)); }
  for opt in --metrics --trace; do
    expect 2 "$opt ck/.spindle-run.lock: is in the folder of --checkpoint ck, where .spindle-run.lock is a name checkpoints take" -- \
      mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --checkpoint ck --resume "$opt" ck/.spindle-run.lock
  done
  # Two fresh runs into one empty folder: both find it empty, the second
  # to take the lock finds the first's checkpoints and is refused (it
  # replaced them, exit 0). SPINDLE_TEST_LOCK_AFTER holds B before the lock
  # until A has finished. B gets a session folder of its own: the two
  # mpiexec start at the same moment, and Open MPI 4.1's creation of a
  # shared one races (open-mpi/ompi#8510, docs/building.md; it failed this
  # test once, 2026-12-07).
  rm -rf race go
  mkdir -p "${OMPI_MCA_orte_tmpdir_base:-/tmp}/b"
  (SPINDLE_TEST_LOCK_AFTER="$work/go" OMPI_MCA_orte_tmpdir_base="${OMPI_MCA_orte_tmpdir_base:-/tmp}/b" \
     "$mpiexec" --oversubscribe -np 1 "$run" one.json --model "$models/tiny-clip.yaml" \
     --steps 2 --every 2 --seed 7 --checkpoint race > b.out 2> b.err; echo $? > b.rc) &
  b=$!
  expect 0 "" -- mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 2 --every 2 --checkpoint race
  touch go
  wait "$b"
  if [ "$(cat b.rc)" != 2 ] || ! grep -qF -- "--checkpoint race: holds checkpoints of another run (step-000002)" b.err; then
    echo "FAIL: a second fresh run into a folder taken meanwhile: exit $(cat b.rc): $(head -c 300 b.err)"
    failures=$((failures + 1))
  fi
  grep -q '"seed": 0' race/step-000002/manifest.json ||
    { echo "FAIL: the first run's checkpoint was replaced"; failures=$((failures + 1)); }
  # A manifest nested 100000 arrays deep: refused by name, no crash.
  python3 -c "import sys; open(sys.argv[1], 'w').write('{\"version\": ' + '[' * 100000 + ']' * 100000 + '}')" \
    ck/step-000001/manifest.json
  expect 2 "manifest.json: nested more than 64" -- \
    mpi 1 "$run" one.json --model "$models/tiny-clip.yaml" --steps 3 --checkpoint ck --seed 7 --resume
  ;;
*) echo "unknown mode $mode"; exit 1 ;;
esac
echo "$failures failure(s)"
[ "$failures" -eq 0 ]
