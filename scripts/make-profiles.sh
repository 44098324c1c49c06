#!/usr/bin/env bash
# Regenerates profiles/<model>.<cluster>.json: the analytic profile of every
# shipped model (configs/models/*.yaml) on every shipped cluster
# (configs/clusters/*.yaml). Deterministic: rerunning gives the same bytes.
#
# Usage: scripts/make-profiles.sh            (uses $BUILD_DIR/apps/spindle-profile,
#                                             building it when missing)
#        SPINDLE_PROFILE=/path/to/spindle-profile scripts/make-profiles.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

if [ -n "${SPINDLE_PROFILE:-}" ]; then
  PROFILE_BIN=$SPINDLE_PROFILE
  [ -x "$PROFILE_BIN" ] || { echo "make-profiles: error: SPINDLE_PROFILE=$PROFILE_BIN: not an executable program" >&2; exit 2; }
else
  PROFILE_BIN=$BUILD_DIR/apps/spindle-profile
  if [ ! -x "$PROFILE_BIN" ]; then
    # The build folder's own configuration (a cached option such as
    # SPINDLE_BUILD_RUNTIME stays as the user set it), spindle-profile alone.
    cmake -S "$SPINDLE_ROOT" -B "$BUILD_DIR" >/dev/null
    cmake --build "$BUILD_DIR" --target spindle-profile -j "$JOBS"
  fi
fi

OUT_DIR="$SPINDLE_ROOT/profiles"
mkdir -p "$OUT_DIR"
count=0
# The tiny models (tests, CPU runs) go with the CPU clusters, the others with
# the GPU clusters.
for model in "$SPINDLE_ROOT"/configs/models/*.yaml; do
  for cluster in "$SPINDLE_ROOT"/configs/clusters/*.yaml; do
    m="$(basename "$model" .yaml)"
    c="$(basename "$cluster" .yaml)"
    case "$m:$c" in
      tiny-lm:cpu-1x1) continue ;;   # its tensor_parallel 2 trunk needs 2 devices
      digits-mm:*) continue ;;       # the real example: planned with the in-memory analytic profile
      tiny-*:cpu-*|tiny-*:a800-1x8) ;;
      tiny-*:*|*:cpu-*) continue ;;
    esac
    "$PROFILE_BIN" "$model" --cluster "$cluster" --analytic -o "$OUT_DIR/$m.$c.json"
    count=$((count + 1))
  done
done
echo "make-profiles: wrote $count profiles to $OUT_DIR"
