#!/usr/bin/env bash
# Builds here, on a development machine with the CUDA toolkit, what
# scripts/gpu-check.sh would otherwise build on the lent GPU machine, and
# packs it for the device run (docs/gpu.md, "Running it on the lent GPU
# machine"). The build took 174 s on one H200 machine and over 200 s on
# another, out of 15 minutes of device time per session.
#
#   scripts/gpu-prebuild.sh        writes .gpu-prebuilt/build-gpu.tar.gz and .gpu-prebuilt/stamp
#
# Then carry both .gpu-deps and .gpu-prebuilt. gpu-check.sh unpacks the
# build into build-gpu when the stamp matches the tree it runs on (a hash
# of its files' paths and contents, scripts/gpu-common.sh) and its programs
# start with the carried libraries; otherwise it builds there as before.
#
# The build is configured as gpu-check.sh configures it (CUDA on, the same
# targets), in Release with the programs stripped (RelWithDebInfo's would
# not fit the 64 MiB that travels), and with the MPI launcher at the path
# where the carried bundle puts it there (/opt/spindle-deps), which the
# ctest files name. The binaries link the Debian 12 libraries by soname,
# which the bundle provides there.
set -euo pipefail
source "$(dirname "$0")/common.sh"
source "$SPINDLE_ROOT/scripts/gpu-common.sh"
BUILD="$SPINDLE_ROOT/build-gpu"
OUT_DIR="$SPINDLE_ROOT/.gpu-prebuilt"
JOBS="${JOBS:-$(nproc)}"
DEPS_PREFIX="${SPINDLE_DEPS_PREFIX:-/opt/spindle-deps}"

spindle_nvcc_on_path ||
  { echo "gpu-prebuild: no nvcc (the CUDA toolkit is needed to build the CUDA backend)" >&2; exit 2; }

# The tree's stamp: a hash of its files' paths and contents.
stamp="$(spindle_tree_stamp "$SPINDLE_ROOT")"

rm -rf "$BUILD"
# shellcheck disable=SC2046 # empty or one word
cmake -S "$SPINDLE_ROOT" -B "$BUILD" $(spindle_generator "$BUILD") -DCMAKE_BUILD_TYPE=Release \
  -DSPINDLE_WITH_CUDA=ON -DCMAKE_EXE_LINKER_FLAGS=-s \
  -DMPIEXEC_EXECUTABLE="$DEPS_PREFIX/root/usr/bin/mpiexec"
cmake --build "$BUILD" -j "$JOBS" --target "${SPINDLE_GPU_TARGETS[@]}"

# What the checks run: the programs, the ctest files (test lists included)
# and the scripts they name from the build folder; no objects or archives.
mkdir -p "$OUT_DIR"
tar -C "$SPINDLE_ROOT" -czf "$OUT_DIR/build-gpu.tar.gz.part" \
  --exclude='*.o' --exclude='*.a' --exclude='*.ninja' --exclude='.ninja_*' --exclude='CMakeFiles' \
  build-gpu
mv "$OUT_DIR/build-gpu.tar.gz.part" "$OUT_DIR/build-gpu.tar.gz"
printf '%s\n' "$stamp" > "$OUT_DIR/stamp"
echo "gpu-prebuild: $(du -h "$OUT_DIR/build-gpu.tar.gz" | cut -f1) in $OUT_DIR/build-gpu.tar.gz for $stamp"
