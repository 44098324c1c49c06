#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, and runs the whole
# test suite through ctest. Usage: scripts/test.sh [ctest arguments...]
#
# Then the hardening steps (docs/hardening.md): a clang build in build-asan
# with AddressSanitizer and UndefinedBehaviorSanitizer, the whole suite run
# there (ctest arguments are not passed on), and the bounded libFuzzer runs of
# the readers (label `fuzz`). SPINDLE_TEST_SANITIZE=0 skips them.
set -euo pipefail
source "$(dirname "$0")/common.sh"

# The wall time of each step, printed last, also when a step fails: the log
# of a slow or failed CI run shows where its time went (docs/building.md,
# "Test time").
steps=()
step_start=$SECONDS
step_done() {  # step_done LABEL: the step since the last one ended
  steps+=("$1 $((SECONDS - step_start)) s")
  step_start=$SECONDS
}
report_times() {
  local rc=$? joined="" step
  for step in "${steps[@]}"; do joined+="${joined:+, }$step"; done
  [ "$rc" -ne 0 ] && joined+="${joined:+, }the step that failed $((SECONDS - step_start)) s"
  echo "test: wall time per step: $joined; in all $SECONDS s"
}
trap report_times EXIT

# The test programs' own sources at -O1 (the code under test keeps -O2):
# they only call it, and compile in about 30% less time.
spindle_build -DSPINDLE_WERROR=ON -DSPINDLE_TEST_COMPILE_OPTIONS=-O1
step_done "setup and build"
# --no-tests=error: a selection that matches nothing (scripts/test.sh -R
# typo, a label renamed) fails; ctest alone says "No tests were found!!!"
# and exits 0.
ctest --test-dir "$BUILD_DIR" --no-tests=error --output-on-failure -j "$JOBS" --timeout 600 "$@"
step_done "suite"

if [ "${SPINDLE_TEST_SANITIZE:-1}" = 0 ]; then
  echo "test: sanitizer and fuzz steps skipped (SPINDLE_TEST_SANITIZE=0)"
  exit 0
fi
ASAN_DIR="${ASAN_BUILD_DIR:-$SPINDLE_ROOT/build-asan}"
# -O1 for the code under test: the sanitized suite runs three times as fast
# as with -O0 (2 min against 6 on 2 cores). -O0 for the test programs' own
# sources, which only call it: they compile in half the time.
# -O0 for the mains in apps/ as well: in this build they only serve the
# tests (SPINDLE_APP_COMPILE_OPTIONS, apps/CMakeLists.txt).
# -gline-tables-only is enough for file:line in reports.
# Linked with lld where it is installed (Debian's lld): the 23 programs'
# link steps (test discovery included) took 8.0 s of CPU, against 24.3 s
# with the default linker (docs/building.md).
LINKER=()
if command -v ld.lld > /dev/null; then
  LINKER=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
fi
# shellcheck disable=SC2046 # empty or one word
CXX=clang++ cmake -S "$SPINDLE_ROOT" -B "$ASAN_DIR" $(spindle_generator "$ASAN_DIR") -DCMAKE_BUILD_TYPE=Debug "${UNITY[@]}" \
  "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -gline-tables-only" -DSPINDLE_TEST_COMPILE_OPTIONS=-O0 -DSPINDLE_APP_COMPILE_OPTIONS=-O0 -DSPINDLE_WERROR=ON \
  -DSPINDLE_SANITIZE=address,undefined -DSPINDLE_BUILD_BENCH=OFF "${LINKER[@]}"
cmake --build "$ASAN_DIR" -j "$JOBS"
step_done "sanitizer build"
# Any undefined behaviour stops the test (it is also compiled with
# -fno-sanitize-recover=undefined).
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# The equivalence runs under mpirun compare fewer plans here (run_checks.sh):
# the pass above compared them all.
export SPINDLE_TEST_SANITIZED=1
# Leaks are checked in the tests of our own code. Programs that start Open
# MPI (labels exec/mpi, exec/profile, ckpt and any other label not listed
# here) run without leak checking: Open MPI keeps allocations until exit.
OWN_CODE='^(plan/.*|exec|cli|regress|fuzz)$'
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir "$ASAN_DIR" --no-tests=error --output-on-failure -j "$JOBS" --timeout 600 -L "$OWN_CODE"
step_done "sanitized own code and fuzzing"
# Not lint:shellcheck again (label lint): it reads the scripts, not the
# build, and the first suite ran it (6 s).
ASAN_OPTIONS=detect_leaks=0 ctest --test-dir "$ASAN_DIR" --no-tests=error --output-on-failure -j "$JOBS" --timeout 600 \
  -LE "^(plan/.*|exec|cli|regress|fuzz|lint)\$"
step_done "sanitized Open MPI programs"
