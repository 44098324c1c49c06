# Sourced by the scripts: build folder, parallelism and the Open MPI settings
# that let mpirun work as root and in containers (docs/building.md).
SPINDLE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SPINDLE_ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1

spindle_build() {
  "$SPINDLE_ROOT/scripts/setup.sh"
  cmake -S "$SPINDLE_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  cmake --build "$BUILD_DIR" -j "$JOBS"
}
