#!/usr/bin/env bash
# lint:shellcheck: every shell script of the repository passes ShellCheck at
# severity warning (errors and warnings; its info and style notes are left
# to the reader). The scripts are what users run first (scripts/demo.sh,
# scripts/test.sh, the Slurm launcher), so a quoting or splitting slip there
# costs a user's first run.
#
#   bash test/lint/shellcheck.sh SOURCE_ROOT
#
# Scripts: every *.sh and *.sbatch, and .ci/run, outside build folders
# (build*/), .git and the GPU bundles (.gpu-*). Fewer than MIN_SCRIPTS found
# fails: a broken search must not pass by checking nothing. Exits 77
# (ctest: skipped) when shellcheck is not installed; scripts/setup.sh
# installs it.
set -euo pipefail
root=${1:?usage: shellcheck.sh SOURCE_ROOT}
MIN_SCRIPTS=20

if ! command -v shellcheck > /dev/null; then
  echo "lint:shellcheck: shellcheck is not installed (scripts/setup.sh installs it): skipped"
  exit 77
fi

cd "$root"
mapfile -d '' scripts < <(find . \( -path './build*' -o -path ./.git -o -path './.gpu-*' \) -prune -o \
                                  -type f \( -name '*.sh' -o -name '*.sbatch' -o -path ./.ci/run \) -print0 | sort -z)
if [ "${#scripts[@]}" -lt "$MIN_SCRIPTS" ]; then
  echo "lint:shellcheck: found ${#scripts[@]} scripts under $root, expected at least $MIN_SCRIPTS" >&2
  exit 1
fi
echo "lint:shellcheck: $(shellcheck --version | sed -n 's/^version: //p'), ${#scripts[@]} scripts"
# -x: follow `source` to the files the scripts name, where it can.
shellcheck -x --severity=warning "${scripts[@]}"
echo "lint:shellcheck: ${#scripts[@]} scripts pass"
