#!/usr/bin/env bash
# cli:install: `cmake --install` gives a tree that works on its own, from any
# folder, after being moved (docs/building.md, "Installing").
#
# Usage: install.sh BUILD_DIR SOURCE_DIR SCRATCH [MPIEXEC]
#   BUILD_DIR   the build to install (built already)
#   SOURCE_DIR  the repository (the lists of what must be installed)
#   SCRATCH     a folder of its own, emptied first
#   MPIEXEC     given when spindle-run is built: two steps of tiny-clip on
#               2 ranks run from the installed programs
#
# Checks:
# 1. the install lists the programs and nothing else in bin/, every shipped
#    config and profile, the Slurm scripts and the docs;
# 2. DESTDIR (a packager's staging) puts everything under it, while the
#    installed spindle.sbatch names the final prefix; a prefix it cannot
#    name (a $ in it) is refused before anything is copied;
# 3. moved elsewhere and run from an empty folder with SPINDLE_HOME unset,
#    spindle-plan finds its default cluster in the moved tree (the
#    `cluster` line names it); SPINDLE_HOME points it at another configs/;
# 4. the installed programs plan and train tiny-clip on 2 ranks;
# 5. the installed Slurm launcher runs the installed programs.
set -euo pipefail
BUILD=$1 SRC=$2 S=$3 MPIEXEC=${4:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
rm -rf "$S" && mkdir -p "$S"

# 1. What is installed.
cmake --install "$BUILD" --prefix "$S/prefix" > "$S/install.log" 2>&1 || fail "cmake --install: $(tail -5 "$S/install.log")"
P=$S/prefix
expected="spindle-plan spindle-profile"
[ -n "$MPIEXEC" ] && expected="spindle-export spindle-plan spindle-profile spindle-run"
got=$(cd "$P/bin" && ls | sort | tr '\n' ' ')
[ "$got" = "$(tr ' ' '\n' <<< "$expected" | sort | tr '\n' ' ')" ] || fail "bin/ holds '$got', expected '$expected'"
for program in $expected; do [ -x "$P/bin/$program" ] || fail "bin/$program is not executable"; done
for tree in configs profiles; do
  want=$(cd "$SRC/$tree" && find . -type f | sort)
  have=$(cd "$P/share/spindle/$tree" && find . -type f | sort)
  [ "$want" = "$have" ] || fail "share/spindle/$tree differs from $tree/: $(diff <(echo "$want") <(echo "$have") | head -5)"
done
for script in spindle.sbatch spindle-launch.sh; do
  [ -x "$P/share/spindle/scripts/slurm/$script" ] || fail "share/spindle/scripts/slurm/$script missing or not executable"
done
for doc in README.md LICENSE docs/building.md docs/spec/cli.md; do
  [ -f "$P/share/doc/spindle/$doc" ] || fail "share/doc/spindle/$doc missing"
done
grep -qF "\${SPINDLE_ROOT:-$P/share/spindle}/scripts/slurm/spindle-launch.sh" "$P/share/spindle/scripts/slurm/spindle.sbatch" ||
  fail "the installed spindle.sbatch does not default SPINDLE_ROOT to $P/share/spindle: $(grep 'exec bash' "$P/share/spindle/scripts/slurm/spindle.sbatch")"

# 2. DESTDIR: staged under it, pointing at the final prefix.
DESTDIR="$S/stage" cmake --install "$BUILD" --prefix /opt/spindle-test > "$S/stage.log" 2>&1 || fail "DESTDIR install: $(tail -5 "$S/stage.log")"
[ -x "$S/stage/opt/spindle-test/bin/spindle-plan" ] || fail "DESTDIR: no stage/opt/spindle-test/bin/spindle-plan"
[ ! -e /opt/spindle-test ] || fail "DESTDIR: /opt/spindle-test was written"
grep -qF '${SPINDLE_ROOT:-/opt/spindle-test/share/spindle}' "$S/stage/opt/spindle-test/share/spindle/scripts/slurm/spindle.sbatch" ||
  fail "DESTDIR: the staged spindle.sbatch does not name /opt/spindle-test/share/spindle"

# A prefix the batch script cannot name in its "${SPINDLE_ROOT:-...}" is
# refused before anything is copied.
if cmake --install "$BUILD" --prefix "$S/a\$b" > "$S/dollar.log" 2>&1; then fail "a prefix with \$ was installed"; fi
grep -q 'cannot name a path with' "$S/dollar.log" || fail "a prefix with \$: no message naming it: $(tail -3 "$S/dollar.log")"
[ ! -e "$S/a\$b" ] || fail "a prefix with \$: refused, but $S/a\$b was written"

# 3. Moved, from an empty folder: the default cluster comes from the moved tree.
mv "$P" "$S/moved"
M=$S/moved
mkdir "$S/work" && cd "$S/work"
env -u SPINDLE_HOME "$M/bin/spindle-plan" "$M/share/spindle/configs/models/tiny-clip.yaml" -o plan.json > plan.log 2>&1 ||
  fail "moved spindle-plan: $(cat plan.log)"
grep -qxF "cluster   $M/share/spindle/configs/clusters/a800-1x8.yaml (the default; --cluster chooses another)" plan.log ||
  fail "moved spindle-plan did not take its default cluster from the moved tree: $(grep '^cluster' plan.log || head -3 plan.log)"
mkdir -p "$S/home/configs/clusters"
sed 's/^name:.*/name: home-default/' "$M/share/spindle/configs/clusters/a800-1x8.yaml" > "$S/home/configs/clusters/a800-1x8.yaml"
SPINDLE_HOME="$S/home" "$M/bin/spindle-plan" "$M/share/spindle/configs/models/tiny-clip.yaml" -o home.json > home.log 2>&1 ||
  fail "spindle-plan with SPINDLE_HOME: $(cat home.log)"
grep -q '^plan .* on home-default ' home.log || fail "SPINDLE_HOME's cluster not used: $(head -2 home.log)"

# 4. Plan and train from the installed programs alone.
if [ -n "$MPIEXEC" ]; then
  "$M/bin/spindle-plan" "$M/share/spindle/configs/models/tiny-clip.yaml" \
    --cluster "$M/share/spindle/configs/clusters/cpu-1x2.yaml" -o p2.json > p2.log 2>&1 || fail "plan on cpu-1x2: $(cat p2.log)"
  "$MPIEXEC" -np 2 --oversubscribe "$M/bin/spindle-run" p2.json --model "$M/share/spindle/configs/models/tiny-clip.yaml" \
    --steps 2 --metrics m.jsonl > run.log 2>&1 || fail "installed spindle-run on 2 ranks: $(tail -5 run.log)"
  [ "$(wc -l < m.jsonl)" -eq 2 ] || fail "installed spindle-run: $(wc -l < m.jsonl) metrics lines, expected 2"

  # 5. The installed launcher finds the installed programs (a dry run).
  env -u SPINDLE_BIN -u SPINDLE_ROOT SLURM_JOB_NODELIST=node1 SLURM_NNODES=1 SPINDLE_GPUS_PER_NODE=2 SPINDLE_DRY_RUN=1 \
    SPINDLE_MODEL="$M/share/spindle/configs/models/tiny-clip.yaml" \
    SPINDLE_CLUSTER="$M/share/spindle/configs/clusters/cpu-1x2.yaml" SPINDLE_RUN_DIR="$S/work/slurm" \
    bash "$M/share/spindle/scripts/slurm/spindle-launch.sh" > launch.log 2>&1 || fail "installed launcher: $(cat launch.log)"
  q=$(LC_ALL=C printf %q "$M/bin")
  grep -qF "+ $q/spindle-plan " launch.log || fail "the installed launcher does not plan with $M/bin/spindle-plan: $(grep '^+' launch.log)"
  grep -qF " $q/spindle-run " launch.log || fail "the installed launcher does not run $M/bin/spindle-run: $(grep '^+' launch.log)"
fi
echo "PASS: installed $expected with configs, profiles, Slurm scripts and docs; staged with DESTDIR; moved, the default cluster comes from the moved tree${MPIEXEC:+; it trained 2 steps on 2 ranks and its launcher runs its programs}"
