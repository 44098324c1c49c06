#!/usr/bin/env bash
# cli:compare-json: spindle-plan --compare-json writes the table --compare
# prints, as data (docs/spec/cli.md).
#
# Usage: compare_json.sh BIN CONFIGS SCRATCH
# Checks, on multitask-clip-10 on a800-1x8 (where task-level's plan is over
# memory) and on tiny-clip (every strategy within memory):
# - the printed table: --compare-json implies --compare, and each printed
#   row has the JSON row's figures, rounded as the table rounds them;
# - the rows: the four strategies in the table's order; sequential's
#   speedup 1; each speedup sequential's iteration over the row's;
#   over_memory_device exactly where the table says "over memory", and
#   refused_on_gpus_device where it says "refused on GPUs" (the plan
#   within its count but over as spindle-run holds it on GPUs:
#   sequential's and intra-task's multitask-clip-10 on a800-1x8, 83.2 and
#   83.3 GiB; not spindle's, sharded for it, 79.0);
# - spindle's row simulates the plan -o wrote (predicted.simulated_ms), and
#   that plan is byte for byte the one planned without --compare;
# - refusals: the same path as -o, or as the model, exit 2 and nothing
#   written; with --check, exit 2.
set -euo pipefail
BIN=$1 CONFIGS=$2 S=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$S" && mkdir -p "$S" && cd "$S"

for case in "multitask-clip-10 a800-1x8" "tiny-clip a800-1x8"; do
  read -r model cluster <<< "$case"
  "$BIN/spindle-plan" "$CONFIGS/models/$model.yaml" --cluster "$CONFIGS/clusters/$cluster.yaml" \
    --compare-json "$model.cmp.json" -o "$model.plan.json" > "$model.out" 2>&1 || fail "$model: $(cat "$model.out")"
  python3 - "$model" <<'EOF' || fail "$model: the JSON does not match the table (above)"
import json, sys
model = sys.argv[1]
table = json.load(open(model + ".cmp.json"))
plan = json.load(open(model + ".plan.json"))
out = open(model + ".out").read().splitlines()
bad = []
def need(cond, what):
    if not cond: bad.append(what)
need(table["format"] == "spindle-compare" and table["version"] == 1, "format and version")
need(table["model"] == model and table["devices"] == plan["cluster"]["devices"], "model and devices")
rows = table["strategies"]
need([r["strategy"] for r in rows] == ["sequential", "task-level", "intra-task", "spindle"], "the strategies in table order")
printed = {line.split()[0]: line for line in out if line.split() and line.split()[0] in
           ("sequential", "task-level", "intra-task", "spindle")}
seq = rows[0]["iteration_ms"]
need(rows[0]["speedup"] == 1.0, "sequential's speedup")
for r in rows:
    name = r["strategy"]
    if "error" in r:
        need("not available" in printed.get(name, ""), name + ": an error row the table does not show")
        continue
    words = printed[name].split()
    need(words[1] == "%.3f" % r["iteration_ms"], name + ": iteration_ms " + words[1])
    need(words[2] == "%.2fx" % r["speedup"], name + ": speedup " + words[2])
    need(abs(r["speedup"] - seq / r["iteration_ms"]) < 1e-12, name + ": speedup is not sequential's over its own")
    need(words[3] == "%.2f%%" % r["gap_percent"], name + ": gap " + words[3])
    need(words[4] == "%.2f%%" % r["transfer_percent"], name + ": transfer " + words[4])
    need(words[5] == "%.2f%%" % r["sync_percent"], name + ": sync " + words[5])
    need(words[6] == "%.3f" % r["barrier_ms"], name + ": barrier_ms " + words[6])
    need(words[9] == r["optimizer_state"], name + ": state " + words[9])   # memory is two words, "59.6 GiB"
    need(("over memory" in printed[name]) == ("over_memory_device" in r), name + ": over memory disagrees")
    need(("over_memory_device" in r) == (r["peak_memory_bytes"] > r["device_memory_bytes"]), name + ": peak and over memory")
    need(("refused on GPUs" in printed[name]) == ("refused_on_gpus_device" in r), name + ": refused on GPUs disagrees")
    need(("refused_on_gpus_device" in r) ==
         ("over_memory_device" not in r and r["gpu_run_memory_bytes"] > r["device_memory_bytes"]),
         name + ": GPU figure and refused on GPUs")
    need(r["device_memory_bytes"] == plan["cluster"]["memory_bytes"], name + ": device memory")
spindle = rows[3]
need(round(spindle["iteration_ms"], 3) == plan["predicted"]["simulated_ms"], "spindle's row is not the plan written")
for b in bad: print("  " + b)
print(model + ": " + ("ok" if not bad else "%d problems" % len(bad)), ", ".join(
    "%s %s" % (r["strategy"], "over memory" if "over_memory_device" in r else "fits") for r in rows if "error" not in r))
sys.exit(1 if bad else 0)
EOF
  grep -q '^strategy  *iteration_ms' "$model.out" || fail "$model: --compare-json printed no table"
  # The plan written is the compared one (not planned again): the same bytes
  # as planned alone.
  "$BIN/spindle-plan" "$CONFIGS/models/$model.yaml" --cluster "$CONFIGS/clusters/$cluster.yaml" \
    -o "$model.alone.json" > /dev/null 2>&1 || fail "$model planned alone"
  cmp -s "$model.plan.json" "$model.alone.json" || fail "$model: the plan written with --compare-json differs from the plan alone"
done
grep -q '"over_memory_device"' multitask-clip-10.cmp.json || fail "multitask-clip-10 on a800-1x8: no row over memory (task-level was)"
python3 -c 'import json, sys; rows = json.load(open("multitask-clip-10.cmp.json"))["strategies"]; sys.exit(0 if {"sequential", "intra-task"} == {r["strategy"] for r in rows if "refused_on_gpus_device" in r} else 1)' ||
  fail "multitask-clip-10 on a800-1x8: the rows refused on GPUs are not sequential's and intra-task's (83.2 and 83.3 GiB of 80; spindle's, sharded, 79.0)"
grep -q '^sequential .*  refused on GPUs: device [0-9]* would hold 83.2[0-9] GiB as spindle-run runs it$' multitask-clip-10.out ||
  fail "multitask-clip-10 on a800-1x8: sequential's row does not say it is refused on GPUs"
! grep -q '^spindle .*refused on GPUs' multitask-clip-10.out || fail "multitask-clip-10 on a800-1x8: spindle's row refused on GPUs"
! grep -q 'refused on GPUs' tiny-clip.out || fail "tiny-clip: a row refused on GPUs"

# Refusals, nothing written.
for target in same-as-plan model; do
  path=p.json
  [ "$target" = model ] && path=$CONFIGS/models/tiny-clip.yaml
  before=$(cksum < "$CONFIGS/models/tiny-clip.yaml")
  if "$BIN/spindle-plan" "$CONFIGS/models/tiny-clip.yaml" --compare-json "$path" -o p.json > refuse.log 2>&1; then
    fail "--compare-json $target: accepted"
  else
    rc=$?
  fi
  [ "$rc" = 2 ] || fail "--compare-json $target: exit $rc, expected 2"
  grep -q -- '--compare-json' refuse.log || fail "--compare-json $target: the message does not name the flag: $(cat refuse.log)"
  [ ! -e p.json ] || fail "--compare-json $target: p.json written"
  [ "$(cksum < "$CONFIGS/models/tiny-clip.yaml")" = "$before" ] || fail "--compare-json $target: the model changed"
done
if "$BIN/spindle-plan" "$CONFIGS/models/tiny-clip.yaml" --check multitask-clip-10.plan.json --compare-json c.json > check.log 2>&1; then
  fail "--check with --compare-json: accepted"
fi
echo "PASS: --compare-json writes the table's rows and figures, spindle's is the plan written; refused over -o, an input, and with --check"
