#!/usr/bin/env bash
# Runtime checks of spindle-run under mpirun, one mode per ctest test.
#
#   run_checks.sh MODE BIN_DIR SOURCE_DIR WORK_DIR MPIEXEC COMPARE_RUNS
#
# MODE
#   equiv-tiny-clip, equiv-tiny-lm  plan the model for 1, 3 and 4 devices
#       (spindle) and 4 devices (sequential), train 5 steps each, and compare
#       every step's losses and every final parameter with the 1-device run
#       (compare_runs: 1e-5 relative, absolute floor 1e-6). tiny-lm's trunk
#       has tensor_parallel 2, which no 1-device plan can hold: its reference
#       is the same model with tensor_parallel 1 (same parameter names, so
#       the same initial values and data; TP only splits the arithmetic).
#   wrong-world     a 4-device plan on 2 ranks: exit 2 with a message, fast.
#   other-model     tiny-lm's plan run with tiny-clip's model: rejected (exit 2).
#   corrupt-plan    a truncated plan file: rejected (exit 2).
#   missing-model   a model path that does not exist: rejected (exit 2).
#   rank-dies       rank 1 calls _exit(9) at step 2 of a 4-rank run
#       (SPINDLE_TEST_DIE_AT_STEP): the job ends non-zero well within 60 s.
set -uo pipefail
MODE=$1 BIN=$2 SRC=$3 WORK=$4 MPIEXEC=$5 COMPARE=$6
MODELS=$SRC/configs/models CLUSTERS=$SRC/configs/clusters
mkdir -p "$WORK/$MODE" && cd "$WORK/$MODE" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

die() { echo "FAIL: $*" >&2; exit 1; }
plan() {  # plan MODEL.yaml DEVICES OUT [--strategy S]
  "$BIN/spindle-plan" "$1" --cluster "$CLUSTERS/cpu-1x$2.yaml" -o "$3" "${@:4}" > "$3.log" 2>&1 ||
    die "spindle-plan $1 on $2 devices: $(cat "$3.log")"
}
run() {  # run NP PLAN MODEL [args...]: exit code in $rc, output in run.log
  local np=$1; shift
  timeout 100 "$MPIEXEC" -np "$np" --oversubscribe "$BIN/spindle-run" "$1" --model "$2" "${@:3}" > run.log 2>&1
  rc=$?
}
expect_reject() {  # expect_reject WHAT PATTERN: after run, exit 2 and the message
  cat run.log
  [ "$rc" -eq 2 ] || die "$1: exit code $rc, expected 2"
  grep -q "$2" run.log || die "$1: no message matching '$2'"
  [ "$(grep -c 'spindle-run: error' run.log)" -eq 1 ] || die "$1: expected exactly one error line"
  echo "PASS: $1 rejected with exit 2"
}

case "$MODE" in
  equiv-*)
    name=${MODE#equiv-}
    model=$MODELS/$name.yaml ref_model=$model
    if grep -q 'tensor_parallel: 2' "$model"; then
      ref_model=$PWD/$name-tp1.yaml
      sed 's/tensor_parallel: 2/tensor_parallel: 1/' "$model" > "$ref_model"
    fi
    plan "$ref_model" 1 p1.json
    plan "$model" 3 p3.json
    plan "$model" 4 p4.json
    plan "$model" 4 p4seq.json --strategy sequential
    status=0
    for v in 1 3 4 4seq; do
      np=${v%seq} m=$model
      [ "$v" = 1 ] && m=$ref_model
      rm -f "m$v.jsonl" "params$v.json"
      run "$np" "p$v.json" "$m" --steps 5 --seed 3 --metrics "m$v.jsonl" --dump-params "params$v.json"
      [ "$rc" -eq 0 ] || { cat run.log; die "run $v (np $np) exit $rc"; }
      tail -n 1 run.log
      if [ "$v" != 1 ]; then
        echo "== $name: plan $v against 1 device"
        "$COMPARE" m1.jsonl params1.json "m$v.jsonl" "params$v.json" || status=1
      fi
    done
    exit $status ;;
  wrong-world)
    plan "$MODELS/tiny-clip.yaml" 4 p4.json
    start=$SECONDS
    run 2 p4.json "$MODELS/tiny-clip.yaml" --steps 2
    expect_reject "plan for 4 devices on 2 ranks" "plan is for 4 devices but mpirun started 2 ranks"
    [ $((SECONDS - start)) -lt 30 ] || die "took $((SECONDS - start)) s" ;;
  other-model)
    plan "$MODELS/tiny-lm.yaml" 4 p4.json
    run 4 p4.json "$MODELS/tiny-clip.yaml" --steps 2
    expect_reject "plan for tiny-lm with tiny-clip's model" "tiny-lm\|sha256\|model" ;;
  corrupt-plan)
    plan "$MODELS/tiny-clip.yaml" 4 p4.json
    head -c 200 p4.json > broken.json
    run 4 broken.json "$MODELS/tiny-clip.yaml" --steps 2
    expect_reject "truncated plan" "broken.json" ;;
  missing-model)
    plan "$MODELS/tiny-clip.yaml" 4 p4.json
    run 4 p4.json "$PWD/no-such-model.yaml" --steps 2
    expect_reject "missing model" "no-such-model.yaml" ;;
  rank-dies)
    plan "$MODELS/tiny-clip.yaml" 4 p4.json
    start=$SECONDS
    SPINDLE_TEST_DIE_AT_STEP=2 run 4 p4.json "$MODELS/tiny-clip.yaml" --steps 20
    took=$((SECONDS - start))
    cat run.log
    [ "$rc" -ne 0 ] || die "exit code 0 after a rank died"
    [ "$rc" -ne 124 ] || die "the job hung (killed by timeout)"
    [ "$took" -lt 60 ] || die "took $took s"
    echo "PASS: job ended with exit $rc after $took s" ;;
  *) die "unknown mode $MODE" ;;
esac
