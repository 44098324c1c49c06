#!/usr/bin/env bash
# The prepared GPU check (docs/gpu.md), for a fresh GPU machine: builds with
# the CUDA backend, runs the gpu tests (op parity, the runtime equivalence
# on one GPU and, with several, under mpirun), the layer benchmark
# bench/gpu, and spindle-profile --measure --backend cuda. Every step is
# time-boxed and logged; a failed step does not stop the later ones. The
# time boxes (LIMITS below) plus each box's kill grace add up to at most
# GPU_CHECK_BUDGET_S (default 540 s, for a device run of 570 s: the rest is
# for unpacking the bundle and packing results); the script checks the sum
# before it starts and never gives a step more than the time that is left.
#
#   scripts/gpu-check.sh            results in $OUT, or ./gpu-out
#
# A machine without the Debian packages (and without a network) uses the
# bundle that scripts/gpu-deps.sh puts in .gpu-deps/: carried there, it is
# unpacked into /opt/spindle-deps (SPINDLE_DEPS_PREFIX) and used from there
# (scripts/gpu-deps-env.sh). NCCL is taken from the CUDA toolkit, else from
# the pip package nvidia-nccl-cu13 when python3 has it.
#
# Output: logs, CSVs and profiles go to a work folder ($GPU_CHECK_WORK,
# default /tmp/spindle-gpu-check); $OUT receives only summary.txt (one line
# per step: name, exit code, seconds), ctest-gpu.log, bench-gpu.log and
# gpu-check.tar.gz (the whole work folder: environment.txt, nvidia-smi.txt,
# deps.log, configure.log, build.log, CMakeCache.txt, every step's log,
# bench-gpu.csv, profile-*.json), refreshed after every step so that a run
# stopped at its limit still returns what it did.
# Exit code: 0 when every step passed, 1 otherwise.
set -uo pipefail
source "$(dirname "$0")/common.sh"
source "$SPINDLE_ROOT/scripts/gpu-deps-env.sh"
source "$SPINDLE_ROOT/scripts/gpu-common.sh"
OUT="${OUT:-$PWD/gpu-out}"
WORK="${GPU_CHECK_WORK:-/tmp/spindle-gpu-check}"
[ -n "${GPU_CHECK_WORK:-}" ] || rm -rf "$WORK"   # only the default folder is cleared
mkdir -p "$OUT" "$WORK"
BUILD="${GPU_BUILD_DIR:-$SPINDLE_ROOT/build-gpu}"
JOBS="${JOBS:-16}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
failed=0
start_all=$SECONDS

# Time box of every step in seconds (the conditional ones included: setup
# runs only without cmake, kernels only with ncu, profile-tiny-clip-np2 only
# with 2+ GPUs). Measured on the H200 machines (2026-12-04): configure 4-5 s,
# build 174 s on one and over 200 s on another, ctest-gpu 20-23 s, bench-vith
# 6-9 s, bench-vith-fp32 3 s, kernels 9-20 s, bench-gpu over 45 s (cut at
# its box twice, in the 4096-wide rows), profile-tiny-clip 3 s,
# profile-tiny-lm 1 s, loop-gpu 9 s.
declare -A LIMITS=(
  [nvidia-smi]=10 [setup]=20 [configure]=20 [build]=255 [ctest-gpu]=35
  [bench-vith]=15 [bench-vith-fp32]=10 [kernels]=20 [bench-gpu]=75
  [profile-tiny-clip]=5 [profile-tiny-lm]=10 [profile-tiny-clip-np2]=15 [loop-gpu]=20
)
KILL_GRACE_S=2   # timeout --kill-after: a step that ignores SIGTERM gets this much more
BUDGET_S="${GPU_CHECK_BUDGET_S:-540}"
total_s=0
for name in "${!LIMITS[@]}"; do total_s=$((total_s + LIMITS[$name] + KILL_GRACE_S)); done
if [ "$total_s" -gt "$BUDGET_S" ]; then
  echo "gpu-check: the step limits add up to ${total_s}s, over the budget of ${BUDGET_S}s" | tee -a "$SUMMARY"
  exit 1
fi
echo "gpu-check: step limits add up to ${total_s}s of the ${BUDGET_S}s budget"

pack() {
  cp "$SUMMARY" "$WORK/summary.txt"
  for f in ctest-gpu.log bench-gpu.log; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$OUT/$f"; done
  tar -czf "$OUT/gpu-check.tar.gz.part" -C "$(dirname "$WORK")" "$(basename "$WORK")" 2>/dev/null &&
    mv "$OUT/gpu-check.tar.gz.part" "$OUT/gpu-check.tar.gz"
}

# note NAME RC T0: one summary line.
note() {
  printf '%-24s rc=%-4s %4ss\n' "$1" "$2" "$((SECONDS - $3))" | tee -a "$SUMMARY"
  [ "$2" -eq 0 ] || failed=1
}

# step NAME COMMAND...: runs COMMAND with the time box LIMITS[NAME] (less
# when less of the budget is left), output to $WORK/NAME.log, one summary
# line.
step() {
  local name=$1 t0=$SECONDS rc
  local limit=${LIMITS[$name]:?"gpu-check: no time box for step $name"}
  local left=$((BUDGET_S - (SECONDS - start_all) - KILL_GRACE_S))
  shift
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    echo "== $name: skipped, the budget is spent" | tee "$WORK/$name.log"
    note "$name" 124 "$t0"
    return 124
  fi
  echo "== $name (time box ${limit}s): $*"
  timeout --kill-after="$KILL_GRACE_S" "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  note "$name" "$rc" "$t0"
  [ "$rc" -eq 0 ] || tail -n 30 "$WORK/$name.log"
  pack
  return "$rc"
}

# CMake and ninja from pip when they are not on PATH.
for tool in cmake ninja; do
  if ! command -v "$tool" > /dev/null; then
    d=$(python3 -c "import $tool, sys; print(getattr($tool, 'CMAKE_BIN_DIR', None) or $tool.BIN_DIR)" 2>/dev/null) &&
      [ -x "$d/$tool" ] && PATH="$d:$PATH"
  fi
done
spindle_nvcc_on_path || true   # configure then says why the CUDA backend cannot be built

# 0. Dependencies: the carried bundle where the Debian packages are missing.
SPINDLE_DEPS_CMAKE_ARGS=()
t0=$SECONDS
if spindle_deps_needed; then
  spindle_deps_use "${SPINDLE_DEPS_PREFIX:-/opt/spindle-deps}" > "$WORK/deps.log" 2>&1
  rc=$?
  cat "$WORK/deps.log"
  note deps "$rc" "$t0"
else
  echo "deps: system packages (no bundle used)" | tee "$WORK/deps.log"
fi

# NCCL: the toolkit's, else the pip package's (nvidia-nccl-cu13).
nvcc_path=$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
spindle_nccl_args "$(dirname "$(dirname "$nvcc_path")")/include" > "$WORK/nccl.log" 2>&1
tee -a "$WORK/deps.log" < "$WORK/nccl.log"

GEN=()
if ! command -v make > /dev/null && command -v ninja > /dev/null; then GEN=(-G Ninja); fi

{
  echo "date: $(date -u)"
  echo "host: $(hostname) cores: $(nproc)"
  grep PRETTY_NAME /etc/os-release
  echo "commit: $(git -C "$SPINDLE_ROOT" rev-parse HEAD 2>/dev/null) $(git -C "$SPINDLE_ROOT" status --short 2>/dev/null | wc -l) changed files"
  command -v nvcc || ls /usr/local/cuda/bin/nvcc
  nvcc --version 2>&1 | tail -n 2
  g++ --version | head -n 1
  cmake --version | head -n 1
  echo "make: $(command -v make) ninja: $(command -v ninja) generator: ${GEN[*]:-default}"
  echo "mpicxx: $(command -v mpicxx) mpirun: $(command -v mpirun)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "CMAKE_PREFIX_PATH=${CMAKE_PREFIX_PATH:-}"
  env | grep -E '^(OPAL|PMIX|OMPI|HWLOC)_' | sort
} > "$WORK/environment.txt" 2>&1
step nvidia-smi bash -c 'nvidia-smi; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv'
cp "$WORK/nvidia-smi.log" "$WORK/nvidia-smi.txt" 2>/dev/null

command -v cmake > /dev/null || step setup "$SPINDLE_ROOT/scripts/setup.sh"

# 1. Build: CUDA required (configure fails without it), only the targets the
# checks use. No -Werror: the machine's compiler may be newer than Debian's.
# A build carried in .gpu-prebuilt (scripts/gpu-prebuild.sh) is used instead
# when it was made from this very tree and its programs start here; any
# other case builds here, as before (GPU_PREBUILT=0 forces that).
prebuilt=0
carried="$SPINDLE_ROOT/.gpu-prebuilt"
if [ "${GPU_PREBUILT:-1}" != 0 ] && [ -f "$carried/build-gpu.tar.gz" ] && [ -f "$carried/stamp" ]; then
  t0=$SECONDS
  want=$(cat "$carried/stamp")
  have=$(spindle_tree_stamp "$SPINDLE_ROOT")
  if [ "$BUILD" != "$SPINDLE_ROOT/build-gpu" ]; then
    why="GPU_BUILD_DIR is not build-gpu"
  elif [ "$want" != "$have" ]; then
    why="made from another tree ($want), this one is $have"
  else
    rm -rf "$BUILD"
    if tar -C "$SPINDLE_ROOT" -xzf "$carried/build-gpu.tar.gz" &&
      "$BUILD/test/gpu/gpu_tool" count > "$WORK/prebuilt.log" 2>&1 &&
      "$BUILD/apps/spindle-run" --help >> "$WORK/prebuilt.log" 2>&1; then
      prebuilt=1
    else
      why="its programs do not start here: $(tail -n 2 "$WORK/prebuilt.log" 2>/dev/null | tr '\n' ' ')"
      rm -rf "$BUILD"
    fi
  fi
  if [ "$prebuilt" = 1 ]; then
    echo "prebuilt: the carried build of $want, unpacked in $((SECONDS - t0))s" | tee -a "$SUMMARY"
  else
    echo "prebuilt: not used ($why); building here" | tee -a "$SUMMARY"
  fi
fi
if [ "$prebuilt" = 0 ]; then
  step configure cmake -S "$SPINDLE_ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSPINDLE_WITH_CUDA=ON "${SPINDLE_DEPS_CMAKE_ARGS[@]}" "${SPINDLE_NCCL_CMAKE_ARGS[@]}"
  grep "spindle: CUDA backend" "$WORK/configure.log"
  cp "$BUILD/CMakeCache.txt" "$WORK/CMakeCache.txt" 2>/dev/null
  step build cmake --build "$BUILD" -j "$JOBS" --target "${SPINDLE_GPU_TARGETS[@]}"
fi

# 2. Tests labelled gpu: op parity, AdamW, the runtime equivalence (one
# GPU, and mpirun -np 2: NCCL with 2+ GPUs, host-staged MPI with one). On a
# machine with a GPU none of them may be skipped.
gpus=$("$BUILD/test/gpu/gpu_tool" count 2>/dev/null || echo 0)
echo "CUDA devices: $gpus" | tee -a "$WORK/environment.txt"
# -V: the parity tests print their worst relative errors.
step ctest-gpu ctest --test-dir "$BUILD" -L gpu --no-tests=error -V --timeout 60
if [ "$gpus" -ge 1 ] && grep -q "(Skipped)" "$WORK/ctest-gpu.log"; then
  echo "ctest-gpu: tests skipped although $gpus GPU(s) are visible" | tee -a "$SUMMARY"
  failed=1
fi

# 3. Layer throughput: the target (50% of peak) first (the hidden-1280 layers,
# ViT-H among them, bf16 then fp32 for comparison), then every shipped
# transformer layer shape over a range of local batches.
step bench-vith "$BUILD/bench/gpu/gpu" --hidden 1280 --batches 16,64,128,256 --csv "$WORK/bench-vith.csv" \
  --budget-ms 60
grep -E "^gpu:" "$WORK/bench-vith.log" | tee -a "$SUMMARY"
step bench-vith-fp32 "$BUILD/bench/gpu/gpu" --hidden 1280 --batches 64 --precision fp32 --budget-ms 60
# Where the ViT-H layer's time goes, kernel by kernel (Nsight Compute,
# when the machine has it and may read the counters): the first 300 kernel
# launches of bench/gpu at batch 64 are the warm-up and timed repeats of
# the ViT-H layer (about 70 kernels each).
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
if [ -n "$ncu_bin" ]; then
  step kernels "$ncu_bin" --metrics gpu__time_duration.sum --print-summary per-kernel --csv --launch-count 300 \
    "$BUILD/bench/gpu/gpu" --hidden 1280 --batches 64 --budget-ms 1
fi
step bench-gpu "$BUILD/bench/gpu/gpu" --batches 1,16,256 --csv "$WORK/bench-gpu.csv" --budget-ms 30
grep -E "^gpu:" "$WORK/bench-gpu.log"

# 4. spindle-profile --measure on the GPU: tiny-clip, and tiny-lm for its
# tensor-parallel trunk, each for two device counts. (multitask-clip-4 did
# not end in 40 s on 8 devices, 66 of 84 points, nor in 25 s on 1 and 8:
# the host draws every point's parameters and inputs, and patch_embed's
# data at every repeat, about 1-2 s per ViT-H point.)
CL="$SPINDLE_ROOT/configs/clusters"
step profile-tiny-clip "$BUILD/apps/spindle-profile" "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" \
  --cluster "$CL/cpu-1x4.yaml" --devices 1,2 -o "$WORK/profile-tiny-clip.json" --measure --backend cuda --point-ms 20
step profile-tiny-lm "$BUILD/apps/spindle-profile" "$SPINDLE_ROOT/configs/models/tiny-lm.yaml" \
  --cluster "$CL/cpu-1x4.yaml" --devices 2,4 -o "$WORK/profile-tiny-lm.json" --measure --backend cuda --point-ms 20
if [ "$gpus" -ge 2 ]; then
  step profile-tiny-clip-np2 mpirun -np 2 "$BUILD/apps/spindle-profile" \
    "$SPINDLE_ROOT/configs/models/tiny-clip.yaml" --cluster "$CL/cpu-1x4.yaml" --devices 1,2 \
    -o "$WORK/profile-tiny-clip-np2.json" --measure --backend cuda --point-ms 20
fi

# 5. The planner's prediction against a GPU run (bench/loop.sh): tiny-clip's
# profile measured on the GPU, a one-device plan made with it, 30 steps run
# with and without --trace, predicted and measured step and boxes compared.
step loop-gpu env SPINDLE_BACKEND=cuda "$SPINDLE_ROOT/bench/loop.sh" "$BUILD" 1 tiny-clip 30
# Its run's memory on the GPU (the pool's high watermark) against what
# spindle-run's check counted (docs/planner.md, "What spindle-run holds,
# and the plan's count"): the GPU figure's first measurement, into the
# summary.
grep -m 1 '^spindle-run: memory:' "$WORK/loop-gpu.log" | tee -a "$SUMMARY" || true

echo "total $((SECONDS - start_all))s" | tee -a "$SUMMARY"
pack
cat "$SUMMARY"
exit "$failed"
