#!/usr/bin/env bash
# Plans and launches spindle-run over every GPU of a Slurm allocation
# (docs/slurm.md). Runs inside the job (spindle.sbatch calls it), on the
# job's first node: writes the cluster file for this allocation, plans on
# this node, then starts one spindle-run rank per GPU with srun (or mpirun),
# resuming from the newest complete checkpoint when there is one, so a
# requeued job continues where it stopped.
#
# Settings (environment):
#   SPINDLE_MODEL        model YAML (required)
#   SPINDLE_CLUSTER      cluster YAML of one node's devices and links (required);
#                        islands and devices_per_island are set to the allocation
#   SPINDLE_BIN          folder of spindle-plan and spindle-run (default: build/apps
#                        of this tree, or PREFIX/bin when this script is installed
#                        as PREFIX/share/spindle/scripts/slurm/, `cmake --install`)
#   SPINDLE_RUN_DIR      outputs: cluster.yaml, plan.json, checkpoints/, metrics.jsonl
#                        (default: $SLURM_SUBMIT_DIR/spindle-run-$SLURM_JOB_ID, which a
#                        requeued job keeps; a new job resumes a run only when given
#                        its folder here)
#   SPINDLE_STEPS (1000) SPINDLE_EVERY (100) SPINDLE_SEED (0) SPINDLE_BACKEND (cuda)
#   SPINDLE_STRATEGY     spindle-plan --strategy (default spindle)
#   SPINDLE_PROFILE      spindle-plan --profile PROFILE.json (default: analytic)
#   SPINDLE_LAUNCHER     srun (default) | mpirun
#   SPINDLE_GPUS_PER_NODE  overrides SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE
#   SPINDLE_DRY_RUN=1    print what would be written and run, run nothing
# Arguments: passed on to every spindle-run rank after the launcher's own
# (--data, --eval-data, --lr and the schedule, --clip-grad, --log-interval,
# ...); with --clip-grad C (C > 0) the plan is made with spindle-plan
# --grad-norm, so its predictions are of the programs that run. The
# flags the launcher sets itself are refused there (exit 2): --model,
# --steps, --seed, --backend, --checkpoint, --every, --resume, --overwrite,
# --metrics; set them through the variables above.
# Slurm variables read: SLURM_JOB_NODELIST, SLURM_NNODES (or
# SLURM_JOB_NUM_NODES), SLURM_GPUS_ON_NODE (or SLURM_GPUS_PER_NODE, e.g.
# "h200:8"), SLURM_JOB_ID, SLURM_SUBMIT_DIR.
# Exit: the launcher's exit code; 2 on missing settings.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "spindle-launch: error: $*" >&2; exit 2; }
# Only 1 is a dry run: a job script that sets 0 (or "false") to turn dry
# runs off must not train nothing and exit 0.
case "${SPINDLE_DRY_RUN:-}" in
  "" | 0) DRY="" ;;
  1) DRY=1 ;;
  *) fail "SPINDLE_DRY_RUN='$SPINDLE_DRY_RUN': expected 1 (a dry run) or 0 (a run; the same as unset)" ;;
esac
say() { echo "spindle-launch: $*"; }
# run CMD...: prints "+ CMD" (shell-quoted); runs it unless dry.
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ -n "$DRY" ] || "$@"
}

# First host of a Slurm host list: "gpu[07-08,11],cpu1" -> gpu07 (by
# scontrol inside a job, by hand in a dry run or where scontrol fails).
first_host() {
  local host=""
  if [ -z "$DRY" ] && command -v scontrol > /dev/null 2>&1; then
    host=$(scontrol show hostnames "$1" 2> /dev/null | head -n 1)
  fi
  if [ -n "$host" ]; then
    echo "$host"
    return
  fi
  local prefix=${1%%[[,]*} rest
  rest=${1:${#prefix}}
  if [ "${rest:0:1}" = "[" ]; then
    rest=${rest:1}
    echo "$prefix${rest%%[-,\]]*}"
  else
    echo "$prefix"
  fi
}

# spindle-run's flags that the launcher sets (a second value would be
# refused by spindle-run after planning, or, for --resume, skip the check
# for a checkpoint).
clip=0 prev=""
for arg in "$@"; do
  flag=${arg%%=*}
  [ "$prev" = --clip-grad ] && clip=$arg   # --clip-grad C
  [ "$flag" = --clip-grad ] && [ "$flag" != "$arg" ] && clip=${arg#*=}   # --clip-grad=C
  prev=$arg
  case "$flag" in
    --model) fail "$flag: the launcher sets it; use SPINDLE_MODEL" ;;
    --steps|--seed|--backend|--every)
      var=${flag#--}; fail "$flag: the launcher sets it; use SPINDLE_${var^^}" ;;
    --checkpoint|--metrics) fail "$flag: the launcher writes it under SPINDLE_RUN_DIR" ;;
    --resume|--overwrite)
      fail "$flag: the launcher resumes by itself when SPINDLE_RUN_DIR/checkpoints holds a checkpoint" ;;
  esac
done

[ -n "${SLURM_JOB_NODELIST:-}" ] ||
  fail "SLURM_JOB_NODELIST is not set: run inside a Slurm job (sbatch scripts/slurm/spindle.sbatch), or set the SLURM_* variables for a dry run"
[ -n "${SPINDLE_MODEL:-}" ] || fail "SPINDLE_MODEL (the model YAML) is not set"
[ -n "${SPINDLE_CLUSTER:-}" ] || fail "SPINDLE_CLUSTER (a one-node cluster YAML, e.g. configs/clusters/h200-1x8.yaml) is not set"
[ -r "$SPINDLE_CLUSTER" ] || fail "SPINDLE_CLUSTER=$SPINDLE_CLUSTER: cannot read"
nodes=${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-}}
[ -n "$nodes" ] || fail "SLURM_NNODES is not set"
gpus=${SPINDLE_GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}}
gpus=${gpus##*:}  # "h200:8" -> 8
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] ||
  fail "GPUs per node unknown ('$gpus'): submit with --gpus-per-node=N or set SPINDLE_GPUS_PER_NODE"
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || fail "SLURM_NNODES='$nodes' is not a positive integer"
world=$((nodes * gpus))
# The settings checked before anything is written (a dry run included).
STEPS=${SPINDLE_STEPS:-1000} EVERY=${SPINDLE_EVERY:-100} SEED=${SPINDLE_SEED:-0}
BACKEND=${SPINDLE_BACKEND:-cuda} STRATEGY=${SPINDLE_STRATEGY:-spindle}
LAUNCHER=${SPINDLE_LAUNCHER:-srun}
for setting in "SPINDLE_STEPS=$STEPS" "SPINDLE_EVERY=$EVERY" "SPINDLE_SEED=$SEED"; do
  [[ "${setting#*=}" =~ ^[0-9]+$ ]] || fail "$setting: expected a whole number"
done
case "$LAUNCHER" in
  srun | mpirun) ;;
  *) fail "SPINDLE_LAUNCHER=$LAUNCHER: expected srun or mpirun" ;;
esac

# The programs: SPINDLE_BIN, else build/apps of this tree (a checkout), else
# the bin/ of an installed tree (ROOT is PREFIX/share/spindle there).
if [ -n "${SPINDLE_BIN:-}" ]; then
  BIN=$SPINDLE_BIN
elif [ ! -x "$ROOT/build/apps/spindle-run" ] && [ -x "$ROOT/../../bin/spindle-run" ]; then
  BIN=$(cd "$ROOT/../../bin" && pwd)
else
  BIN=$ROOT/build/apps
fi
if [ -z "$DRY" ]; then
  for program in spindle-plan spindle-run; do
    [ -x "$BIN/$program" ] ||
      fail "$BIN/$program: no such program (build first: cmake --build build; or set SPINDLE_BIN to the folder that holds spindle-plan and spindle-run)"
  done
fi
RUN_DIR=${SPINDLE_RUN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/spindle-run-${SLURM_JOB_ID:-0}}
CKPT=$RUN_DIR/checkpoints

say "job ${SLURM_JOB_ID:-?}: first node $(first_host "$SLURM_JOB_NODELIST"), $nodes nodes x $gpus GPUs = $world ranks${DRY:+ (dry run)}"

# 1. The cluster of this allocation: one island per node.
# (Windows line ends dropped: the rewritten name would keep a \r, which the
# cluster reader refuses, naming the generated file rather than the user's.)
cluster=$(sed -E -e 's/\r$//' -e "s/^islands:.*/islands: $nodes/" -e "s/^devices_per_island:.*/devices_per_island: $gpus/" \
              -e "s/^name:[[:space:]]*(.*)/name: \1-slurm-${nodes}x${gpus}/" "$SPINDLE_CLUSTER")
# Rewritten only where each key stands on a line of its own at the top
# level (block style, as configs/clusters/ writes them). A cluster in flow
# style ({islands: 1, ...}) would keep its one node, and every rank past
# it would be refused by spindle-run after the plan: refused here instead.
for key in "islands: $nodes" "devices_per_island: $gpus"; do
  [ "$(grep -c -x -- "$key" <<< "$cluster")" = 1 ] ||
    fail "SPINDLE_CLUSTER=$SPINDLE_CLUSTER: needs '${key%%:*}:' once at the top level on a line of its own (block style, as in configs/clusters/), which the launcher sets to this allocation"
done
if [ -n "$DRY" ]; then
  say "would write $RUN_DIR/cluster.yaml:"
  grep -E '^(name|islands|devices_per_island):' <<< "$cluster"
else
  mkdir -p "$RUN_DIR" || fail "cannot create $RUN_DIR"
  printf '%s\n' "$cluster" > "$RUN_DIR/cluster.yaml" || fail "cannot write $RUN_DIR/cluster.yaml"
fi

# 2. Plan on this (the first) node; milliseconds, so every (re)start replans
#    for the allocation it got.
plan_args=("$BIN/spindle-plan" "$SPINDLE_MODEL" --cluster "$RUN_DIR/cluster.yaml" -o "$RUN_DIR/plan.json")
[ "$STRATEGY" = spindle ] || plan_args+=(--strategy "$STRATEGY")
[ -z "${SPINDLE_PROFILE:-}" ] || plan_args+=(--profile "$SPINDLE_PROFILE")
# Clipping: the norm's wait before the optimizer, planned and simulated.
# (A value that is no number reads as 0 here; spindle-run refuses it.)
awk -v c="$clip" 'BEGIN { exit !(c + 0 > 0) }' && plan_args+=(--grad-norm)
run "${plan_args[@]}" || fail "planning failed"

# 3. Train: resume when a complete checkpoint (step-N, not *.tmp.*) exists.
resume=()
for d in "$CKPT"/step-*; do
  [ -d "$d" ] && [[ "$(basename "$d")" =~ ^step-[0-9]+$ ]] && resume=(--resume)
done
if [ ${#resume[@]} -eq 0 ]; then
  say "outputs in $RUN_DIR (a new job resumes this run with SPINDLE_RUN_DIR=$RUN_DIR)"
else
  say "resuming from the newest checkpoint in $CKPT"
fi
train=("$BIN/spindle-run" "$RUN_DIR/plan.json" --model "$SPINDLE_MODEL" --steps "$STEPS" --backend "$BACKEND"
       --seed "$SEED" --checkpoint "$CKPT" --every "$EVERY" "${resume[@]}" --metrics "$RUN_DIR/metrics.jsonl" "$@")
case "$LAUNCHER" in
  srun)
    # --kill-on-bad-exit: one dead rank ends the step (srun names the task).
    # The job's --cpus-per-task is not passed on to srun by Slurm 22.05 to
    # 23.02 (man srun): asked for again, else each rank gets one CPU.
    cpus=()
    [ -z "${SLURM_CPUS_PER_TASK:-}" ] || cpus=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    run srun --nodes="$nodes" --ntasks="$world" --ntasks-per-node="$gpus" "${cpus[@]}" --gpus-per-task=1 \
        --kill-on-bad-exit=1 --mpi=pmix "${train[@]}" ;;
  mpirun)
    # Open MPI refuses to start as root without being told (containers).
    root=()
    [ "$(id -u)" -ne 0 ] || root=(--allow-run-as-root)
    run mpirun "${root[@]}" -np "$world" --map-by "ppr:$gpus:node" --bind-to none "${train[@]}" ;;
esac
