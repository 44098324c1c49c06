# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh (and usable by hand): makes the Debian 12
# packages that scripts/gpu-deps.sh put in .gpu-deps/ usable on a machine
# that lacks them and has no network (the GPU machine, docs/gpu.md).
#
#   source scripts/gpu-deps-env.sh
#   spindle_deps_needed && spindle_deps_use /opt/spindle-deps
#
# spindle_deps_needed: true when .gpu-deps/*.deb exist and this machine lacks
#   one of the headers or MPI commands Spindle needs (SPINDLE_DEPS=1 forces
#   the bundle, SPINDLE_DEPS=0 never uses it).
# spindle_deps_use PREFIX: unpacks every .deb with dpkg -x (or ar + tar when
#   dpkg-deb is missing) into PREFIX/root, the base libraries listed in
#   .gpu-deps/fallback.txt into PREFIX/fallback (never into /), adds the
#   mpicxx/mpirun links that Debian's alternatives would make, and exports
#   what CMake, the compiler wrapper and the runtime need: CMAKE_PREFIX_PATH,
#   CPLUS_INCLUDE_PATH (the multiarch headers), MPI_HOME, PATH,
#   LD_LIBRARY_PATH (the fallback libraries after the system's folders),
#   Open MPI's OPAL_* and PMIx's PMIX_* install folders (Debian's Open MPI
#   4.1 relocated), HWLOC_PLUGINS_PATH, OMPI_MCA_pml/btl. It sets
#   SPINDLE_DEPS_CMAKE_ARGS (MPI_CXX_COMPILER, MPIEXEC_EXECUTABLE) for cmake.
# spindle_nccl_args CUDA_INCLUDE_DIR: see below.

SPINDLE_DEPS_BUNDLE="${SPINDLE_DEPS_BUNDLE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.gpu-deps}"

spindle_deps_needed() {
  [ "${SPINDLE_DEPS:-}" = 0 ] && return 1
  compgen -G "$SPINDLE_DEPS_BUNDLE/*.deb" > /dev/null || return 1
  [ "${SPINDLE_DEPS:-}" = 1 ] && return 0
  local h
  for h in yaml-cpp/yaml.h eigen3/Eigen/Core nlohmann/json.hpp spdlog/spdlog.h fmt/format.h \
           CLI/CLI.hpp catch2/catch.hpp openssl/sha.h; do
    [ -e "/usr/include/$h" ] || return 0
  done
  command -v mpicxx > /dev/null && command -v mpirun > /dev/null || return 0
  return 1
}

# _spindle_deps_x DEB DIR: dpkg -x, or ar + tar where dpkg-deb is missing.
_spindle_deps_x() {
  if command -v dpkg-deb > /dev/null; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  local t
  t=$(mktemp -d) || return 1
  (cd "$t" && ar x "$1") || { rm -rf "$t"; return 1; }
  local data
  data=$(ls "$t"/data.tar* 2>/dev/null | head -n 1)
  case "$data" in
    *.xz) tar -xJf "$data" -C "$2" ;;
    *.zst) zstd -dc "$data" | tar -x -C "$2" ;;
    *.gz) tar -xzf "$data" -C "$2" ;;
    *) tar -xf "$data" -C "$2" ;;
  esac
  local rc=$?
  rm -rf "$t"
  return $rc
}

spindle_deps_use() {
  local prefix=${1:-/opt/spindle-deps}
  local R="$prefix/root" F="$prefix/fallback" deb pkg n=0
  local A=x86_64-linux-gnu
  case "$prefix" in /|/usr|/usr/*) echo "gpu-deps: refusing to unpack into $prefix" >&2; return 1 ;; esac
  if ! cmp -s "$SPINDLE_DEPS_BUNDLE/manifest.txt" "$prefix/manifest.txt"; then
    if [ ! -e "$prefix/manifest.txt" ] && [ -n "$(ls -A "$prefix" 2>/dev/null)" ]; then
      echo "gpu-deps: $prefix is not empty and holds no bundle: not touching it" >&2
      return 1
    fi
    rm -rf "$prefix"
    mkdir -p "$R" "$F" "$prefix/hwloc-plugins" || return 1
    for deb in "$SPINDLE_DEPS_BUNDLE"/*.deb; do
      pkg=$(basename "$deb" .deb)
      if grep -qx "$pkg" "$SPINDLE_DEPS_BUNDLE/fallback.txt" 2>/dev/null; then
        _spindle_deps_x "$deb" "$F" || { echo "gpu-deps: cannot unpack $deb" >&2; return 1; }
      else
        _spindle_deps_x "$deb" "$R" || { echo "gpu-deps: cannot unpack $deb" >&2; return 1; }
      fi
      n=$((n + 1))
    done
    # What update-alternatives makes on Debian (dpkg -x runs no scripts).
    local w
    for w in mpicxx mpic++ mpiCC mpicc; do ln -sf opal_wrapper "$R/usr/bin/$w"; done
    for w in mpirun mpiexec; do ln -sf orterun "$R/usr/bin/$w"; done
    cp "$SPINDLE_DEPS_BUNDLE/manifest.txt" "$prefix/manifest.txt" 2>/dev/null
    echo "gpu-deps: unpacked $n packages into $prefix"
  else
    echo "gpu-deps: $prefix already holds this bundle"
  fi
  local ompi="$R/usr/lib/$A/openmpi" pmix="$R/usr/lib/$A/pmix2"
  export PATH="$R/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$R/usr/lib/$A:$R/lib/$A:$ompi/lib:$pmix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:/usr/lib/$A:/lib/$A:$F/usr/lib/$A:$F/lib/$A"
  export CMAKE_PREFIX_PATH="$R/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # libssl-dev's openssl/configuration.h lives in the multiarch folder,
  # which the compiler searches only under /usr.
  export CPLUS_INCLUDE_PATH="$R/usr/include/$A${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  export C_INCLUDE_PATH="$R/usr/include/$A${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  export MPI_HOME="$R/usr"
  # CMake 4 rejects package configs that ask for a policy level below 3.5.
  export CMAKE_POLICY_VERSION_MINIMUM="${CMAKE_POLICY_VERSION_MINIMUM:-3.5}"
  # Open MPI 4.1, configured by Debian with prefix /usr, libdir
  # /usr/lib/x86_64-linux-gnu/openmpi/lib, sysconfdir /etc/openmpi.
  export OPAL_PREFIX="$R/usr" OPAL_EXEC_PREFIX="$R/usr" OPAL_BINDIR="$R/usr/bin" OPAL_SBINDIR="$R/usr/sbin"
  export OPAL_LIBEXECDIR="$R/usr/libexec" OPAL_DATAROOTDIR="$R/usr/share" OPAL_DATADIR="$R/usr/share"
  export OPAL_SYSCONFDIR="$R/etc/openmpi" OPAL_LIBDIR="$ompi/lib" OPAL_INCLUDEDIR="$ompi/include"
  export OPAL_PKGDATADIR="$R/usr/share/openmpi" OPAL_PKGLIBDIR="$ompi/lib/openmpi3"
  export OPAL_PKGINCLUDEDIR="$ompi/include/openmpi"
  # PMIx 4.2 (libpmix2), prefix /usr/lib/x86_64-linux-gnu/pmix2.
  export PMIX_PREFIX="$pmix" PMIX_EXEC_PREFIX="$pmix" PMIX_LIBDIR="$pmix/lib" PMIX_PKGLIBDIR="$pmix/lib/pmix"
  export PMIX_DATADIR="$pmix/share" PMIX_PKGDATADIR="$pmix/share/pmix" PMIX_SYSCONFDIR="$pmix/share"
  # Debian's pmix-mca-params.conf names /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix.
  export PMIX_MCA_mca_base_component_path="$pmix/lib/pmix"
  # No hwloc plugins are bundled; keep hwloc off any the host may have.
  export HWLOC_PLUGINS_PATH="$prefix/hwloc-plugins"
  # Shared memory and TCP only (what Debian's openmpi-mca-params.conf
  # leaves too), whatever the image sets for its own MPI: no InfiniBand there.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
  # shellcheck disable=SC2034 # read by the scripts that source this file
  SPINDLE_DEPS_CMAKE_ARGS=(-DMPI_CXX_COMPILER="$R/usr/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$R/usr/bin/mpiexec")
}

# spindle_nccl_args CUDA_INCLUDE_DIR: where the CUDA toolkit (or /usr/include)
# has no nccl.h, looks for the pip package nvidia-nccl-cu13 (python3's
# nvidia.nccl, else nvidia/nccl in any site-packages) and sets
# SPINDLE_NCCL_CMAKE_ARGS to its include folder and library (the wheel has
# only libnccl.so.2, which find_library(nccl) would miss), adding the
# library's folder to LD_LIBRARY_PATH. Prints what it chose.
spindle_nccl_args() {
  local inc=$1 d="" lib sp
  SPINDLE_NCCL_CMAKE_ARGS=()
  if [ -e "$inc/nccl.h" ] || [ -e /usr/include/nccl.h ]; then
    echo "nccl: nccl.h in $inc or /usr/include (cuda.cmake finds it)"
    return 0
  fi
  d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -z "$d" ] || [ ! -e "$d/include/nccl.h" ]; then
    d=""
    for sp in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + sys.path))' 2>/dev/null); do
      if [ -e "$sp/nvidia/nccl/include/nccl.h" ]; then d="$sp/nvidia/nccl"; break; fi
    done
  fi
  lib=""
  [ -n "$d" ] && lib=$(ls "$d"/lib/libnccl.so "$d"/lib/libnccl.so.[0-9]* 2>/dev/null | head -n 1)
  if [ -z "$lib" ]; then
    echo "nccl: none found (no nccl.h in $inc, no python3 package nvidia.nccl): the build goes without NCCL"
    return 0
  fi
  # shellcheck disable=SC2034 # read by the scripts that source this file
  SPINDLE_NCCL_CMAKE_ARGS=(-DSPINDLE_NCCL_INCLUDE_DIR="$d/include" -DSPINDLE_NCCL_LIBRARY="$lib")
  LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  echo "nccl: pip package $d (${lib##*/})"
}
