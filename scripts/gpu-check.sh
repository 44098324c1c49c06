#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md), for a fresh GPU machine: builds with
# the CUDA backend, runs the gpu tests (op parity, the runtime equivalence
# on one GPU and, with several, under mpirun), the layer benchmark
# bench/gpu, and spindle-profile --measure --backend cuda. Every step is
# time-boxed (the whole script stays under 8 minutes) and logged; a failed
# step does not stop the later ones.
#
#   scripts/gpu-check.sh            writes everything under $OUT, or ./gpu-out
#
# Output: summary.txt (one line per step: name, exit code, seconds),
# nvidia-smi.txt, configure.log, build.log, ctest-gpu.log, bench-gpu.log and
# bench-gpu.csv, profile-*.log and profile-*.json, environment.txt.
# Exit code: 0 when every step passed, 1 otherwise.
set -uo pipefail
source "$(dirname "$0")/common.sh"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${GPU_BUILD_DIR:-$SPINDLE_ROOT/build-gpu}"
JOBS="${JOBS:-16}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failed=0
start_all=$SECONDS

# step NAME TIMEOUT_S COMMAND...: runs COMMAND with a time box, output to
# $OUT/NAME.log, one summary line.
step() {
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (time box ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%-24s rc=%-4s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$SUMMARY"
  [ "$rc" -eq 0 ] || { failed=1; tail -n 30 "$OUT/$name.log"; }
  return "$rc"
}

{
  echo "date: $(date -u)"
  echo "host: $(hostname) cores: $(nproc)"
  echo "commit: $(git -C "$SPINDLE_ROOT" rev-parse HEAD 2>/dev/null) $(git -C "$SPINDLE_ROOT" status --short 2>/dev/null | wc -l) changed files"
  command -v nvcc || ls /usr/local/cuda/bin/nvcc
  /usr/local/cuda/bin/nvcc --version 2>&1 | tail -n 2
  g++ --version | head -n 1
  cmake --version | head -n 1
} > "$OUT/environment.txt" 2>&1
step nvidia-smi 30 bash -c 'nvidia-smi; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv'
cp "$OUT/nvidia-smi.log" "$OUT/nvidia-smi.txt" 2>/dev/null

command -v cmake > /dev/null || step setup 120 "$SPINDLE_ROOT/scripts/setup.sh"

# 1. Build: CUDA required (configure fails without it), only the targets the checks use.
step configure 120 cmake -S "$SPINDLE_ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSPINDLE_WITH_CUDA=ON -DSPINDLE_WERROR=ON
grep "spindle: CUDA backend" "$OUT/configure.log"
step build 240 cmake --build "$BUILD" -j "$JOBS" --target spindle-plan spindle-run spindle-profile \
  test_gpu gpu_tool gpu compare_runs

# 2. Tests labelled gpu: op parity, AdamW, the runtime equivalence (one
# GPU, and mpirun -np 2: NCCL with 2+ GPUs, host-staged MPI with one). On a
# machine with a GPU none of them may be skipped.
gpus=$("$BUILD/test/gpu/gpu_tool" count 2>/dev/null || echo 0)
echo "CUDA devices: $gpus" | tee -a "$OUT/environment.txt"
step ctest-gpu 180 ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 170
if [ "$gpus" -ge 1 ] && grep -q "(Skipped)" "$OUT/ctest-gpu.log"; then
  echo "ctest-gpu: tests skipped although $gpus GPU(s) are visible" | tee -a "$SUMMARY"
  failed=1
fi

# 3. Layer throughput of every shipped transformer layer shape.
step bench-gpu 150 "$BUILD/bench/gpu/gpu" --csv "$OUT/bench-gpu.csv" --budget-ms 60
grep -E "^gpu:" "$OUT/bench-gpu.log"

# 4. spindle-profile --measure on the GPU, for two device counts.
CL="$SPINDLE_ROOT/configs/clusters"
step profile-tiny-clip 60 "$BUILD/apps/spindle-profile" "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" \
  --cluster "$CL/cpu-1x4.yaml" --devices 1,2 -o "$OUT/profile-tiny-clip.json" --measure --backend cuda --point-ms 20
step profile-clip-4 120 "$BUILD/apps/spindle-profile" "$SPINDLE_ROOT/configs/models/multitask-clip-4.yaml" \
  --cluster "$CL/h200-1x8.yaml" --devices 1,8 -o "$OUT/profile-clip-4.json" --measure --backend cuda --point-ms 20
if [ "$gpus" -ge 2 ]; then
  step profile-tiny-clip-np2 90 mpirun -np 2 "$BUILD/apps/spindle-profile" \
    "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" --cluster "$CL/cpu-1x4.yaml" --devices 1,2 \
    -o "$OUT/profile-tiny-clip-np2.json" --measure --backend cuda --point-ms 20
fi

echo "total $((SECONDS - start_all))s" | tee -a "$SUMMARY"
cat "$SUMMARY"
exit "$failed"
