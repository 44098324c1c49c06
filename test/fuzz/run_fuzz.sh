#!/usr/bin/env bash
# Bounded libFuzzer run for ctest: run_fuzz.sh WORK FUZZER [libFuzzer flags and seed folders...]
# WORK is emptied first, so every run starts from the seeds alone; new inputs
# land there (never in the source tree). A crash leaves its reproducer where
# -artifact_prefix says; copy it to test/fuzz/corpus/<target>/ once fixed.
set -euo pipefail
work=$1
fuzzer=$2
shift 2
rm -rf "$work"
mkdir -p "$work"
exec "$fuzzer" "$work" "$@"
