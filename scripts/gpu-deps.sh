#!/usr/bin/env bash
# Downloads (apt-get download, no install) the Debian 12 packages that
# scripts/gpu-check.sh needs on a GPU machine that has neither these packages
# nor a network: the headers and CMake configs Spindle builds with, their
# shared libraries, and Open MPI with its runtime closure. They go to
# .gpu-deps/ (git-ignored), which the device `run` call carries
# (docs/gpu.md, "The prepared check"); gpu-check.sh unpacks them with
# dpkg -x into /opt/spindle-deps there, never into /.
#
#   scripts/gpu-deps.sh        run here, on Debian 12 with apt (about 13 MiB)
#
# The closure is `apt-cache depends --recurse` of the dev packages, less:
#  - what any Linux with a C++ compiler has (libc6, libstdc++6, libgcc-s1,
#    the compilers and binutils, debconf/dpkg/perl, adduser);
#  - the -dev packages that only libopenmpi-dev's own dpkg dependencies need
#    (hwloc, libevent, pmix, ibverbs, libnl, ltdl, numa headers): building
#    against Open MPI needs only its own headers and libmpi (mpicxx -showme);
#  - libhwloc-plugins and what it pulls (libxml2, libicu72 alone 9 MiB,
#    X11, OpenCL loader): hwloc loads those plugins only when present, and
#    gpu-check.sh points HWLOC_PLUGINS_PATH at an empty folder;
#  - jQuery (Open MPI's HTML docs), pkg-config (Eigen's CMake config does
#    not use it), gfortran and the Fortran module packages.
# Base libraries that a stock Ubuntu 24.04 almost surely has but might not
# (libudev1, libatomic1, zlib1g, libuuid1, libnuma1) are bundled as well;
# gpu-check.sh puts them after the system's folders on LD_LIBRARY_PATH so
# that the host's own newer copies win.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${GPU_DEPS_DIR:-$ROOT/.gpu-deps}"

DEV=(libcli11-dev libyaml-cpp-dev libeigen3-dev nlohmann-json3-dev libspdlog-dev libfmt-dev
     catch2 libssl-dev libopenmpi-dev)
RUNTIME=(libyaml-cpp0.7 libspdlog1.10 libfmt9 libssl3
         openmpi-bin openmpi-common libopenmpi3
         libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2 libmunge2
         libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1
         libpsm-infinipath1 libpsm2-2 libnl-3-200 libnl-route-3-200)
FALLBACK=(libudev1 libatomic1 zlib1g libuuid1 libnuma1)   # listed in .gpu-deps/fallback.txt

if ! command -v apt-get > /dev/null; then
  echo "gpu-deps: needs apt-get (Debian 12)" >&2
  exit 1
fi
. /etc/os-release
if [ "${VERSION_CODENAME:-}" != bookworm ]; then
  echo "gpu-deps: warning: this is ${PRETTY_NAME:-unknown}, not Debian 12; the bundle is meant to be Debian 12's" >&2
fi
# apt-cache needs package lists; fetch them only when there are none.
if ! apt-cache show --no-all-versions libopenmpi3 > /dev/null 2>&1; then
  apt-get update -qq
fi

# Every package the libraries above depend on must be in the bundle or in
# the base set: check that no dependency was forgotten.
BASE=" libc6 libgcc-s1 libstdc++6 gcc-12-base adduser debconf debconf-2.0 dpkg perl-base
       zlib1g-dev libcrypt1 libselinux1 libpcre2-8-0 libcap2 liblzma5 libzstd1 libbz2-1.0 "
ALL=("${DEV[@]}" "${RUNTIME[@]}" "${FALLBACK[@]}")
have=" ${ALL[*]} "
missing=()
for p in "${RUNTIME[@]}" "${FALLBACK[@]}" libyaml-cpp-dev libspdlog-dev libfmt-dev libssl-dev; do
  while read -r dep; do
    case "$have$BASE" in *" $dep "*) ;; *) missing+=("$p->$dep") ;; esac
  done < <(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
             --no-replaces --no-enhances "$p" | awk '$1 ~ /^\|?(Pre)?Depends:$/ && $2 !~ /^</ {print $2}' | sort -u)
done
# libhwloc-plugins is optional at run time (see above); mpirun needs ssh only
# to start ranks on other nodes.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | grep -v -E -e '^$' -e '->(libhwloc-plugins|openssh-client)$' || true)
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu-deps: warning: dependencies not bundled: ${missing[*]}" >&2
fi

rm -rf "$DEST"
mkdir -p "$DEST"
# apt-get download writes as the _apt user when it can; a root-owned folder
# it cannot write to only costs a warning.
(cd "$DEST" && apt-get download -q "${ALL[@]}" 2>&1 | grep -v -E '^(Get:|Fetched)|unsandboxed' || true)
n=$(ls "$DEST"/*.deb | wc -l)
if [ "$n" -ne ${#ALL[@]} ]; then
  echo "gpu-deps: expected ${#ALL[@]} packages, got $n" >&2
  exit 1
fi
# Plain names (no epoch's %3a) and a manifest of the versions.
for f in "$DEST"/*.deb; do
  pkg=$(dpkg-deb -f "$f" Package)
  echo "$pkg $(dpkg-deb -f "$f" Version) $(stat -c %s "$f")" >> "$DEST/manifest.txt"
  [ "$f" = "$DEST/$pkg.deb" ] || mv "$f" "$DEST/$pkg.deb"
done
printf '%s\n' "${FALLBACK[@]}" > "$DEST/fallback.txt"
echo "gpu-deps: $n packages in $DEST, $(du -sh "$DEST" | cut -f1) in all ($(du -sb "$DEST" | cut -f1) bytes)"
