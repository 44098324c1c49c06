#!/usr/bin/env bash
# The runtime equivalence test on the GPU (label gpu; docs/gpu.md):
# spindle-run --backend cuda against --backend cpu on the same plan, seed and
# steps; every step's task losses must agree (gpu_tool losses).
#
#   gpu_equiv.sh MODE BIN_DIR SOURCE_DIR WORK_DIR MPIEXEC GPU_TOOL
#
# MODE
#   one-gpu   tiny-clip and tiny-lm (tensor_parallel 1 variant) planned for 1
#             device, 5 steps: cuda with bf16 mode within 2e-2 of the
#             CPU, cuda with fp32 matmuls (SPINDLE_CUDA_MATMUL=fp32) within 1e-4.
#   mpi-np2   tiny-clip and tiny-lm (tensor_parallel 2) planned for 2
#             devices, mpirun -np 2 --backend cuda against the 1-device CPU
#             run, within 2e-2. With 2+ GPUs each rank has its own and the
#             group communicators are NCCL; with one GPU both ranks share it
#             and the group communicators are MPI, staged through the host.
# Exits 77 (ctest: skipped) without a GPU.
set -uo pipefail
MODE=$1 BIN=$2 SRC=$3 WORK=$4 MPIEXEC=$5 TOOL=$6
MODELS=$SRC/configs/models CLUSTERS=$SRC/configs/clusters
mkdir -p "$WORK/$MODE" && cd "$WORK/$MODE" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

die() { echo "FAIL: $*" >&2; exit 1; }
gpus=$("$TOOL" count) || die "gpu_tool count failed"
if [ "$gpus" -lt 1 ]; then
  echo "SKIPPED: no CUDA device visible"
  exit 77
fi
plan() {  # plan MODEL.yaml DEVICES OUT
  "$BIN/spindle-plan" "$1" --cluster "$CLUSTERS/cpu-1x$2.yaml" -o "$3" > "$3.log" 2>&1 ||
    die "spindle-plan $1 on $2 devices: $(cat "$3.log")"
}
train() {  # train NP PLAN MODEL BACKEND METRICS
  rm -f "$5"
  timeout 120 "$MPIEXEC" -np "$1" --oversubscribe "$BIN/spindle-run" "$2" --model "$3" --backend "$4" \
    --steps 5 --seed 3 --metrics "$5" > "$5.log" 2>&1 || { cat "$5.log"; die "spindle-run $4 np $1 on $2"; }
  grep -E "spindle-run: (rank 0 on GPU|local ranks)" "$5.log" || true
  tail -n 1 "$5.log"
}
status=0
for name in tiny-clip tiny-lm; do
  model=$MODELS/$name.yaml ref_model=$model
  if grep -q 'tensor_parallel: 2' "$model"; then
    ref_model=$PWD/$name-tp1.yaml
    sed 's/tensor_parallel: 2/tensor_parallel: 1/' "$model" > "$ref_model"
  fi
  plan "$ref_model" 1 "$name-p1.json"
  train 1 "$name-p1.json" "$ref_model" cpu "$name-cpu.jsonl"
  case "$MODE" in
    one-gpu)
      train 1 "$name-p1.json" "$ref_model" cuda "$name-cuda-bf16.jsonl"
      echo "== $name: cuda (bf16 mode) against cpu"
      "$TOOL" losses "$name-cpu.jsonl" "$name-cuda-bf16.jsonl" 2e-2 || status=1
      SPINDLE_CUDA_MATMUL=fp32 train 1 "$name-p1.json" "$ref_model" cuda "$name-cuda-fp32.jsonl"
      echo "== $name: cuda (fp32 matmuls) against cpu"
      "$TOOL" losses "$name-cpu.jsonl" "$name-cuda-fp32.jsonl" 1e-4 || status=1 ;;
    mpi-np2)
      plan "$model" 2 "$name-p2.json"
      train 2 "$name-p2.json" "$model" cuda "$name-cuda-np2.jsonl"
      echo "== $name: 2 ranks on $gpus GPU(s) (cuda, bf16 mode) against 1 CPU device"
      "$TOOL" losses "$name-cpu.jsonl" "$name-cuda-np2.jsonl" 2e-2 || status=1 ;;
    *) die "unknown mode $MODE" ;;
  esac
done
exit $status
