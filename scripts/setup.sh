#!/usr/bin/env bash
# Installs the Debian 12 packages Spindle builds with, when any is missing.
# A no-op (no apt-get call at all) when everything is already present.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libyaml-cpp-dev libeigen3-dev nlohmann-json3-dev libspdlog-dev
  catch2 libopenmpi-dev openmpi-bin libssl-dev
  clang libclang-rt-dev   # sanitizer and libFuzzer build (docs/hardening.md)
  ccache                  # used by CMake when present: rebuilds after the first are faster
  python3                 # the tests' JSON and trace checks (test/cli/hostile.sh, test/exec/mpi/run_checks.sh)
  shellcheck              # lint:shellcheck, every shell script of the repository (test/lint/shellcheck.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo > /dev/null 2>&1 || {
    echo "setup: error: installing packages needs root, and sudo is not installed: run this script as root, or as root: apt-get install ${missing[*]}" >&2
    exit 2
  }
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
