#!/usr/bin/env bash
# The tour: installs what is missing, builds, plans a shipped workload on the
# paper's 4-node A800 testbed, prints the strategy comparison, and trains a
# small model on CPU ranks under mpirun.
set -euo pipefail
source "$(dirname "$0")/common.sh"
spindle_build
OUT="${DEMO_DIR:-$SPINDLE_ROOT/build/demo}"
mkdir -p "$OUT"
BIN="$BUILD_DIR/apps"

echo
echo "== spindle-plan: multitask-clip-10 on 4 x 8 A800 (analytic profile) =="
"$BIN/spindle-plan" "$SPINDLE_ROOT/configs/models/multitask-clip-10.yaml" \
  --cluster "$SPINDLE_ROOT/configs/clusters/a800-4x8.yaml" \
  --compare -o "$OUT/clip10.plan.json" --trace "$OUT/clip10.trace.json"

if [ -x "$BIN/spindle-run" ]; then
  echo
  echo "== spindle-run: tiny-clip on 4 CPU ranks =="
  "$BIN/spindle-plan" "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" \
    --cluster "$SPINDLE_ROOT/configs/clusters/cpu-1x4.yaml" -o "$OUT/tiny.plan.json" >/dev/null
  mpirun -np 4 "$BIN/spindle-run" "$OUT/tiny.plan.json" \
    --model "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" --steps 30 --metrics "$OUT/tiny.metrics.jsonl"
fi
echo
echo "Outputs in $OUT (open the .trace.json files in https://ui.perfetto.dev)."
