# Sourced by the scripts: build folder, parallelism and the Open MPI settings
# that let mpirun work as root and in containers (docs/building.md).
SPINDLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SPINDLE_ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1

# Unity builds (CMAKE_UNITY_BUILD: up to 8 sources of a target compiled as
# one) parse the heavy headers (nlohmann/json, spdlog, yaml-cpp, Catch2)
# once per batch: a fresh build takes about 40% less time on 2 cores
# (docs/building.md). A build by hand keeps one object per source.
UNITY=(-DCMAKE_UNITY_BUILD=ON)

spindle_build() {
  "$SPINDLE_ROOT/scripts/setup.sh"
  cmake -S "$SPINDLE_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${UNITY[@]}" "$@"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}
