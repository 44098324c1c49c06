# shellcheck shell=bash
# Sourced by the scripts: build folder, parallelism and the Open MPI settings
# that let mpirun work as root and in containers (docs/building.md).
SPINDLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SPINDLE_ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1

# Unity builds (CMAKE_UNITY_BUILD: up to 16 sources of a target compiled as
# one) parse the heavy headers (nlohmann/json, spdlog, yaml-cpp, Catch2)
# once per batch: a fresh build takes about 40% less time on 2 cores
# (docs/building.md). 16 rather than CMake's 8: libexec's 37 sources in 3
# batches instead of 5, a fresh gcc build 286 -> 256 s (clang's sanitizer
# build the same either way; 32 no better). A build by hand keeps one
# object per source.
UNITY=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16)

# The generator for a build folder: Ninja for a new one (a fresh build on
# 2 cores took 4m21s against 5m26s with Makefiles, ccache off, minutes
# apart: no recursive make, no dependency scan per target;
# docs/building.md); an existing folder keeps the one it has (CMake refuses
# another). Usage: cmake ... $(spindle_generator DIR)
spindle_generator() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja > /dev/null; then echo "-GNinja"; fi
}

spindle_build() {
  "$SPINDLE_ROOT/scripts/setup.sh"
  # shellcheck disable=SC2046 # empty or one word
  cmake -S "$SPINDLE_ROOT" -B "$BUILD_DIR" $(spindle_generator "$BUILD_DIR") -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${UNITY[@]}" "$@"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}
