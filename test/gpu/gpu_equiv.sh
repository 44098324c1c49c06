#!/usr/bin/env bash
# The runtime equivalence test on the GPU (label gpu; docs/gpu.md):
# spindle-run --backend cuda against --backend cpu on the same seed and
# steps: every step's task losses, every final parameter and every gradient
# of step 1 after the gradient sync must agree (compare_runs; losses
# element by element, tensors in RMS, relative with floor 0.1).
#
#   gpu_equiv.sh MODE BIN_DIR SOURCE_DIR WORK_DIR MPIEXEC GPU_TOOL COMPARE_RUNS
#
# MODE
#   one-gpu   tiny-clip and tiny-lm (tensor_parallel 1 variant) planned for 1
#             device, 5 steps, against the 1-device CPU run.
#   mpi-np2   tiny-clip and tiny-lm (tensor_parallel 2) planned for 2
#             devices, mpirun -np 2 --backend cuda against the 1-device CPU
#             run. With 2+ GPUs each rank has its own and the group
#             communicators are NCCL; with one GPU both ranks share it and
#             the group communicators are MPI, staged through the host.
#             Planned with the optimizer state sharded (ZeRO-1): each rank
#             steps its chunk of the bucket on the device and all-gathers,
#             at the next step's start in the bf16 run (x-lowering
#             param_gather next-step), after the step in the fp32 run.
#             tiny-lm also runs clipped (--clip-grad 1, fp32) against the
#             1-device CPU run clipped: every step's gradient norm too.
# Both modes run twice: the bf16 mode within 2e-2, and fp32 matmuls
# (SPINDLE_CUDA_MATMUL=fp32) within 1e-4 (a learning rate off by 2x moves
# the parameters far more than that).
# Exits 77 (ctest: skipped) without a GPU.
set -uo pipefail
MODE=$1 BIN=$2 SRC=$3 WORK=$4 MPIEXEC=$5 TOOL=$6 COMPARE=$7
MODELS=$SRC/configs/models CLUSTERS=$SRC/configs/clusters
mkdir -p "$WORK/$MODE" && cd "$WORK/$MODE" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_odls_base_sigkill_timeout=0   # no 2 s grace after a refused run (test/CMakeLists.txt)

die() { echo "FAIL: $*" >&2; exit 1; }
gpus=$("$TOOL" count) || die "gpu_tool count failed"
if [ "$gpus" -lt 1 ]; then
  echo "SKIPPED: no CUDA device visible"
  exit 77
fi
plan() {  # plan MODEL.yaml DEVICES OUT [spindle-plan flags]
  "$BIN/spindle-plan" "$1" --cluster "$CLUSTERS/cpu-1x$2.yaml" -o "$3" "${@:4}" > "$3.log" 2>&1 ||
    die "spindle-plan $1 on $2 devices: $(cat "$3.log")"
}
train() {  # train NP PLAN MODEL BACKEND OUT [spindle-run flags]: OUT.jsonl, OUT.params.json, OUT.grads.json
  rm -f "$5.jsonl" "$5.params.json" "$5.grads.json"
  timeout 60 "$MPIEXEC" -np "$1" --oversubscribe "$BIN/spindle-run" "$2" --model "$3" --backend "$4" \
    --steps 5 --seed 3 --metrics "$5.jsonl" --dump-params "$5.params.json" --dump-grads "$5.grads.json" "${@:6}" \
    > "$5.log" 2>&1 || { cat "$5.log"; die "spindle-run $4 np $1 on $2"; }
  grep -E "spindle-run: (rank 0 on GPU|local ranks)" "$5.log" || true
  tail -n 1 "$5.log"
}
compare() {  # compare RTOL REF GOT
  "$COMPARE" --rtol "$1" "$2.jsonl" "$2.params.json" "$3.jsonl" "$3.params.json" || status=1
  "$COMPARE" --rtol "$1" --params "$2.grads.json" "$3.grads.json" || status=1
}
status=0
for name in tiny-clip tiny-lm; do
  model=$MODELS/$name.yaml ref_model=$model pn=
  if grep -q 'tensor_parallel: 2' "$model"; then
    ref_model=$PWD/$name-tp1.yaml
    sed 's/tensor_parallel: 2/tensor_parallel: 1/' "$model" > "$ref_model"
  fi
  plan "$ref_model" 1 "$name-p1.json"
  train 1 "$name-p1.json" "$ref_model" cpu "$name-cpu"
  case "$MODE" in
    one-gpu) np=1 p=$name-p1.json m=$ref_model ;;
    mpi-np2)
      np=2 p=$name-p2.json m=$model pn=$name-p2-next.json
      plan "$model" 2 "$p" --optimizer-state sharded
      # The bf16 run with the values' all-gathers at the next step's start
      # (started on the device, waited for before the forwards), the fp32
      # run with them after the step.
      "$COMPARE" --gather-next-step "$p" "$pn" || die "writing $pn" ;;
    *) die "unknown mode $MODE" ;;
  esac
  train "$np" "${pn:-$p}" "$m" cuda "$name-cuda-bf16"
  echo "== $name: $np rank(s) on $gpus GPU(s), cuda bf16 mode, against 1 CPU device (2e-2)"
  compare 2e-2 "$name-cpu" "$name-cuda-bf16"
  SPINDLE_CUDA_MATMUL=fp32 train "$np" "$p" "$m" cuda "$name-cuda-fp32"
  echo "== $name: $np rank(s) on $gpus GPU(s), cuda fp32 matmuls, against 1 CPU device (1e-4)"
  compare 1e-4 "$name-cpu" "$name-cuda-fp32"
  # Gradient clipping on the device (the norm's sum of squares and AdamW's
  # factor): tiny-lm on 2 ranks (TP shards, sharded state), fp32, against
  # the 1-device CPU run clipped, every step's norm too.
  if [ "$MODE" = mpi-np2 ] && [ "$name" = tiny-lm ]; then
    train 1 "$name-p1.json" "$ref_model" cpu "$name-cpu-clip" --clip-grad 1
    SPINDLE_CUDA_MATMUL=fp32 train "$np" "$p" "$m" cuda "$name-cuda-clip" --clip-grad 1
    echo "== $name: $np ranks on $gpus GPU(s), clipped, cuda fp32 against 1 CPU device clipped (1e-4)"
    compare 1e-4 "$name-cpu-clip" "$name-cuda-clip"
    "$COMPARE" --rtol 1e-4 --grad-norms "$name-cpu-clip.jsonl" "$name-cuda-clip.jsonl" "$name-cuda-clip.grads.json" ||
      status=1
  fi
done
exit $status
