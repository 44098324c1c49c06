#!/usr/bin/env bash
# The tour: installs what is missing, builds the two apps it runs (CPU
# backend only: no tests, no CUDA objects, in build-demo/), plans a shipped
# workload on the paper's 4-node A800 testbed and prints the strategy
# comparison, then trains the real multimodal example (handwritten digits,
# their spoken and written names: configs/data/digits) on 2 CPU ranks under
# mpirun and prints validation retrieval accuracy against chance.
#
#   scripts/demo.sh                 # DEMO_STEPS=160 DEMO_RANKS=2 by default
set -euo pipefail
source "$(dirname "$0")/common.sh"
start=$SECONDS
DEMO_BUILD="${DEMO_BUILD:-$SPINDLE_ROOT/build-demo}"
OUT="${DEMO_DIR:-$DEMO_BUILD/demo}"
STEPS="${DEMO_STEPS:-160}"
RANKS="${DEMO_RANKS:-2}"
EVERY=$((STEPS >= 8 ? STEPS / 8 : 1))   # evaluate and log 8 times
"$SPINDLE_ROOT/scripts/setup.sh"
mkdir -p "$DEMO_BUILD"
# shellcheck disable=SC2046 # empty or one word
cmake -S "$SPINDLE_ROOT" -B "$DEMO_BUILD" $(spindle_generator "$DEMO_BUILD") -DCMAKE_BUILD_TYPE=Release "${UNITY[@]}" \
  -DSPINDLE_BUILD_TESTS=OFF -DSPINDLE_WITH_CUDA=OFF > "$DEMO_BUILD/configure.log" 2>&1 ||
  { cat "$DEMO_BUILD/configure.log"; exit 1; }
cmake --build "$DEMO_BUILD" -j "$JOBS" --target spindle-plan spindle-run
echo "demo: built spindle-plan and spindle-run in $((SECONDS - start)) s"
mkdir -p "$OUT"
BIN="$DEMO_BUILD/apps"
MODELS="$SPINDLE_ROOT/configs/models"
DATA="$SPINDLE_ROOT/configs/data/digits"

echo
echo "== spindle-plan: multitask-clip-10 on 4 x 8 A800 (analytic profile) =="
"$BIN/spindle-plan" "$MODELS/multitask-clip-10.yaml" \
  --cluster "$SPINDLE_ROOT/configs/clusters/a800-4x8.yaml" \
  --compare -o "$OUT/clip10.plan.json" --trace "$OUT/clip10.trace.json"

echo
echo "== spindle-run: digits-mm on $RANKS CPU ranks, real data (configs/data/digits) =="
echo "   tasks: image-text and audio-text retrieval, captioning; validation: unseen writers and voices"
"$BIN/spindle-plan" "$MODELS/digits-mm.yaml" --cluster "$SPINDLE_ROOT/configs/clusters/cpu-1x$RANKS.yaml" \
  -o "$OUT/digits.plan.json" > /dev/null
rm -f "$OUT/digits.metrics.jsonl"
mpirun -np "$RANKS" "$BIN/spindle-run" "$OUT/digits.plan.json" --model "$MODELS/digits-mm.yaml" \
  --data "$DATA/train.yaml" --eval-data "$DATA/val.yaml" --eval-every "$EVERY" \
  --steps "$STEPS" --lr 5e-3 --log-interval "$EVERY" --metrics "$OUT/digits.metrics.jsonl" |
  tee "$OUT/digits.log"

echo
echo "== validation retrieval accuracy (top-1 within batches of 48, both directions; chance 10%) =="
awk '/^evaluation at iteration/ {
       step = $4; line = sprintf("after step %4d:", step)
       for (i = 2; i <= NF; i++) if ($i == "acc:") line = line sprintf("  %s %5.1f%%", $(i - 1), 100 * $(i + 1))
       print line; last = line
     }' "$OUT/digits.log"
echo
echo "Outputs in $OUT (open the .trace.json files in https://ui.perfetto.dev); demo took $((SECONDS - start)) s."
