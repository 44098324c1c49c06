#!/usr/bin/env bash
# Closes the loop on CPU (docs/profiling.md): measure a profile of a model on
# this machine, plan with it, run the plan under mpirun, and compare the
# predicted step and per-wave times with the measured ones (bench/loop.cpp).
#
#   bench/loop.sh [BUILD_DIR] [RANKS] [MODEL] [STEPS] [STRATEGY]
#     BUILD_DIR  default build           RANKS  default 2 (cluster cpu-1xRANKS)
#     MODEL      default tiny-clip       STEPS  default 30 (the first 5 are warm-up)
#     STRATEGY   default spindle (spindle-plan --strategy: e.g. intra-task, for
#                a plan that moves activations between the ranks)
# SPINDLE_OPTIMIZER_STATE=sharded|replicated (default: spindle-plan's auto)
# plans with that optimizer state (sharded: ZeRO-1's reduce-scatters and
# all-gathers are measured and predicted).
# SPINDLE_CLIP_GRAD=C plans with spindle-plan --grad-norm and runs with
# spindle-run --clip-grad C (the gradient norm's all-reduce and its wait
# are measured and predicted as sync).
# SPINDLE_BACKEND=cuda (default cpu) measures and runs on the CUDA backend,
# one GPU per rank (scripts/gpu-check.sh's loop-gpu step, with one rank).
# SPINDLE_LOOP_LOG_INTERVAL=N runs spindle-run with --log-interval N
# (default STEPS: one line, after the last step; 1 is spindle-run's own
# default, a line after every step).
# SPINDLE_LOOP_PROFILE=FILE plans with that profile instead of measuring a
# new one (e.g. the profile.json of a run before): every run then plans the
# same plan, so an A/B of the runtime compares one plan (each --measure
# gives a slightly other profile, and the plan can change with it).
# Prints the profile summary, the plan summary and the comparison table (the
# step and per-rank parts from the run without --trace, the boxes from the one
# with it);
# files go to $BUILD_DIR/loop/. Exit 0 when every command ran (the ratio is
# reported, not enforced: see "within 15%" or "OUTSIDE 15%" on the
# `step (sim)` line).
set -eu
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/common.sh"
build="$(cd "${1:-$root/build}" && pwd)"; ranks="${2:-2}"; model_name="${3:-tiny-clip}"; steps="${4:-30}"
strategy="${5:-spindle}"
model="$root/configs/models/$model_name.yaml"
cluster="$root/configs/clusters/cpu-1x$ranks.yaml"
out="$build/loop/$model_name.cpu-1x$ranks${5:+.$strategy}${SPINDLE_OPTIMIZER_STATE:+.$SPINDLE_OPTIMIZER_STATE}${SPINDLE_CLIP_GRAD:+.clip}"
clip_plan=() clip_run=()
[ -z "${SPINDLE_CLIP_GRAD:-}" ] || { clip_plan=(--grad-norm); clip_run=(--clip-grad "$SPINDLE_CLIP_GRAD"); }
mkdir -p "$out"
rm -f "$out/metrics.jsonl"
mpirun=(mpirun -np "$ranks" --oversubscribe)
backend=(--backend "${SPINDLE_BACKEND:-cpu}")

if [ -n "${SPINDLE_LOOP_PROFILE:-}" ]; then
  [ -f "$SPINDLE_LOOP_PROFILE" ] || { echo "loop.sh: SPINDLE_LOOP_PROFILE=$SPINDLE_LOOP_PROFILE: no such file" >&2; exit 2; }
  echo "== 1. profile: $SPINDLE_LOOP_PROFILE (SPINDLE_LOOP_PROFILE; not measured again)"
  [ "$(realpath "$SPINDLE_LOOP_PROFILE")" = "$(realpath -m "$out/profile.json")" ] ||
    cp "$SPINDLE_LOOP_PROFILE" "$out/profile.json"
else
  echo "== 1. measure: ${mpirun[*]} spindle-profile --measure"
  "${mpirun[@]}" "$build/apps/spindle-profile" "$model" --cluster "$cluster" --measure "${backend[@]}" \
      -o "$out/profile.json"
fi
echo "== 2. plan with the measured profile"
"$build/apps/spindle-plan" "$model" --cluster "$cluster" --profile "$out/profile.json" --strategy "$strategy" \
    --optimizer-state "${SPINDLE_OPTIMIZER_STATE:-auto}" "${clip_plan[@]}" -o "$out/plan.json" \
    --trace "$out/planned-trace.json"
# Measured as users run it, without --trace; then again with --trace for the
# per-box comparison (its compact records change tiny-clip's step and
# all-reduce within the 2-core VM's noise: bench/history.md, 2026-12-05 10:25),
# of the steps after the warm-up alone (--trace-steps), which is all
# bench/loop reads of it. One log line, after the last step (--log-interval
# STEPS, unless SPINDLE_LOOP_LOG_INTERVAL): rank 0 printing a line through
# mpirun's pipe after every step (the default, --log-interval 1) is not in
# the programs, and the other ranks wait for it at the next step's first
# collective (about 0.09 ms a step on tiny-clip; bench/README.md, "loop").
skip=5
log_interval="${SPINDLE_LOOP_LOG_INTERVAL:-$steps}"
trace_steps=()
[ "$steps" -gt "$skip" ] && trace_steps=(--trace-steps "$((skip + 1)):")
echo "== 3. run: ${mpirun[*]} spindle-run ($steps steps), then again with --trace"
"${mpirun[@]}" "$build/apps/spindle-run" "$out/plan.json" --model "$model" --steps "$steps" "${backend[@]}" \
    "${clip_run[@]}" --log-interval "$log_interval" --metrics "$out/metrics.jsonl" | tail -n 1
rm -f "$out/traced-metrics.jsonl"
"${mpirun[@]}" "$build/apps/spindle-run" "$out/plan.json" --model "$model" --steps "$steps" "${backend[@]}" \
    "${clip_run[@]}" --log-interval "$log_interval" --metrics "$out/traced-metrics.jsonl" --trace "$out/trace.json" "${trace_steps[@]}" | tail -n 1
echo "== 4. predicted against measured"
"$build/bench/loop" "$out/plan.json" "$out/trace.json" "$out/metrics.jsonl" --skip "$skip" \
    --model "$model" --cluster "$cluster" --profile "$out/profile.json" --traced-metrics "$out/traced-metrics.jsonl"
