#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, and runs the whole
# test suite through ctest. Usage: scripts/test.sh [ctest arguments...]
set -euo pipefail
source "$(dirname "$0")/common.sh"
spindle_build -DSPINDLE_WERROR=ON
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 600 "$@"
