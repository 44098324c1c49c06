#!/usr/bin/env bash
# The shipped batch script on a real (local, single-node) Slurm, end to end
# (docs/slurm.md "A local single-node Slurm"):
#
#   sbatch_e2e.sh BIN SRC WORK COMPARE [BUILD]
#     BIN      folder of spindle-plan and spindle-run
#     SRC      the repository (scripts/slurm/, configs/)
#     WORK     scratch folder (emptied)
#     COMPARE  test/exec/mpi compare_runs
#     BUILD    the build folder, for part 6 (left out without it)
#
# 1. sbatch scripts/slurm/spindle.sbatch, SPINDLE_LAUNCHER=mpirun, tiny-clip on
#    2 ranks (2 GPUs of the node; --backend cpu), 3 steps, a checkpoint every 2:
#    the job completes, plans for 1 node x 2 devices and saves step 3.
# 2. The same submission with 5 steps and SPINDLE_LAUNCHER=srun (--mpi=pmix):
#    it resumes from step 3, trains steps 4 and 5 only, and its ranks took
#    their local rank from Slurm (SLURM_LOCALID).
# 3. The same with 400 steps, requeued (scontrol requeue) once it has saved a
#    checkpoint at step 10 or later: the job restarts, resumes from step >= 10
#    and reaches 400; its log holds both runs (--open-mode=append). Left out
#    when Slurm holds requeued jobs longer than 20 s (cred_expire;
#    local-cluster.sh sets 10). 400 steps keep the job running for seconds
#    after its step 10 (a tiny-clip step takes about 7 ms): with 40, the
#    job could end, and --keep remove step 10's checkpoint, between two looks.
# 4. SIGKILL to rank 1 of a running job: the job FAILs within 10 s and srun
#    names the task (--kill-on-bad-exit=1).
# 6. The installed tree (cmake --install BUILD --prefix WORK/prefix): its
#    spindle.sbatch, submitted with neither SPINDLE_ROOT nor SPINDLE_BIN
#    set, finds its launcher and the installed programs and trains 2 steps.
# 5. Every step of jobs 1-3 has the losses of one straight run of the same
#    plan under plain mpirun (compare_runs --losses, 1e-5 relative).
#
# Runs only where Slurm answers (sinfo within 2 s) and this host is an idle
# or mixed node of it with 2 CPUs and 2 GPUs (scripts/slurm/local-cluster.sh
# up declares 2 fake GPUs); otherwise exit 77, which ctest reports as skipped.
# SLURM_CONF, when unset, is taken from the local cluster's folder
# (SPINDLE_SLURM_DIR, default /tmp/spindle-slurm) if it has one.
# Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BIN=$1 SRC=$2 WORK=$3 COMPARE=$4 BUILD=${5:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_odls_base_sigkill_timeout=0   # no 2 s grace after a refused run (test/CMakeLists.txt)

die() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

local_conf=${SPINDLE_SLURM_DIR:-/tmp/spindle-slurm}/etc/slurm.conf
if [ -z "${SLURM_CONF:-}" ] && [ -r "$local_conf" ]; then
  export SLURM_CONF=$local_conf
fi
command -v sbatch > /dev/null 2>&1 || skip "no Slurm client commands (scripts/slurm/local-cluster.sh up)"
timeout 2 sinfo -h > /dev/null 2>&1 || skip "Slurm does not answer within 2 s (scripts/slurm/local-cluster.sh up)"
host=$(hostname -s)
# "idle 2 gpu:2" for this host; a login node of a real cluster is not listed.
read -r state cpus gres <<< "$(timeout 2 sinfo -h -N -n "$host" -o '%T %c %G' 2> /dev/null | head -n 1)"
[[ "${state:-}" =~ ^(idle|mixed)$ ]] || skip "this host ($host) is not an idle node of the Slurm (state '${state:-none}')"
[ "${cpus:-0}" -ge 2 ] || skip "node $host has ${cpus:-0} CPUs in Slurm, 2 needed"
[[ "${gres:-}" =~ gpu(:[a-z0-9_]+)?:([0-9]+) ]] && [ "${BASH_REMATCH[2]}" -ge 2 ] ||
  skip "node $host has no 2 GPUs in Slurm (gres '${gres:-}'; local-cluster.sh declares 2 fake ones)"

rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || die "cannot use $WORK"
export SPINDLE_ROOT=$SRC SPINDLE_BIN=$BIN SPINDLE_BACKEND=cpu SPINDLE_EVERY=2 SPINDLE_SEED=0 \
       SPINDLE_MODEL=$SRC/configs/models/tiny-clip.yaml SPINDLE_CLUSTER=$SRC/configs/clusters/cpu-1x4.yaml \
       SPINDLE_RUN_DIR=$WORK/run
unset SPINDLE_STRATEGY SPINDLE_PROFILE SPINDLE_GPUS_PER_NODE SPINDLE_DRY_RUN

# submit LAUNCHER STEPS [SBATCH-ARGS...]: sbatch the shipped script on 1 node
# with 2 GPUs and 1 CPU per task (the script's defaults ask for 8 GPUs with
# 8 CPUs each); the job id in $job, its output in job-ID.out. SBATCH_FILE:
# another batch script than the repository's.
submit() {
  job=$(SPINDLE_LAUNCHER=$1 SPINDLE_STEPS=$2 sbatch --parsable --nodes=1 --nodelist="$host" \
          --gpus-per-node=2 --ntasks-per-node=2 --cpus-per-task=1 --time=00:02:00 \
          --job-name=spindle-test --output="$WORK/job-%j.out" "${@:3}" "${SBATCH_FILE:-$SRC/scripts/slurm/spindle.sbatch}") ||
    die "sbatch failed: $job"
  job=${job%%;*}
}
# finish WHAT SECONDS: waits for $job to end; prints its output; fails unless
# it COMPLETED within SECONDS (then cancels it).
finish() {
  local deadline=$((SECONDS + $2)) state=""
  while [ $SECONDS -lt $deadline ]; do
    state=$(scontrol show job -o "$job" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
    esac
    sleep 0.25
  done
  # Slurm can report the end before the output file is flushed.
  for _ in $(seq 20); do [ -s "job-$job.out" ] && break; sleep 0.1; done
  echo "== job $job, $1: $state"
  cat "job-$job.out" 2> /dev/null
  if [ "$state" != COMPLETED ]; then
    scancel "$job" 2> /dev/null
    die "job $job ($1) ended '${state:-still running after $2 s}', not COMPLETED"
  fi
}
expect() {  # expect FILE PATTERN WHAT
  grep -q -- "$2" "$1" || die "$3 (no line matching '$2' in $1)"
}

start=$SECONDS
submit mpirun 3 --no-requeue
finish "mpirun, 3 steps" 40
out=job-$job.out
expect "$out" "first node $host, 1 nodes x 2 GPUs = 2 ranks" "job 1 did not see its allocation"
grep -q '^devices_per_island: 2' run/cluster.yaml || die "cluster.yaml not written for 2 devices per node"
expect "$out" "+ mpirun -np 2 --map-by ppr:2:node" "job 1 did not launch with mpirun"
expect "$out" "local ranks 0,1 (OMPI_COMM_WORLD_LOCAL_RANK)" "job 1 ranks not started by mpirun"
[ "$(grep -c '^iteration' "$out")" -eq 3 ] || die "job 1: expected 3 iterations"
[ -d run/checkpoints/step-000003 ] || die "job 1: no checkpoint at step 3"
grep -q -- '--resume' "$out" && die "job 1 resumed without a checkpoint"

submit srun 5 --no-requeue
finish "srun, 5 steps" 40
out=job-$job.out
expect "$out" "resuming from the newest checkpoint" "job 2 did not find the checkpoint"
expect "$out" "+ srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --gpus-per-task=1 --kill-on-bad-exit=1 --mpi=pmix" \
  "job 2 did not launch with srun"
expect "$out" "local ranks 0,1 (SLURM_LOCALID)" "job 2 ranks did not take their local rank from Slurm"
expect "$out" "resumed from $WORK/run/checkpoints/step-000003" "job 2 did not resume from step 3"
grep '^iteration' "$out" | awk '{ print $2 }' | tr '\n' ' ' | grep -qx '4/ 5/ ' || die "job 2: expected steps 4 and 5 only"
[ -d run/checkpoints/step-000005 ] || die "job 2: no checkpoint at step 5"

# 3. A job requeued mid-run (as after a node failure; the script says
#    --requeue) restarts and resumes from its newest checkpoint. Slurm holds
#    a requeued job for cred_expire seconds (local-cluster.sh: 10).
expire=$(scontrol show config | grep -o 'cred_expire=[0-9]*' | cut -d= -f2)
if [ "${expire:-120}" -le 20 ]; then
  steps=400
  submit srun "$steps"
  # newest: the step of the newest checkpoint in run/ (0 when none).
  newest() {
    local d n=0
    for d in run/checkpoints/step-[0-9]*; do
      [[ "$d" =~ step-([0-9]+)$ ]] && [ $((10#${BASH_REMATCH[1]})) -gt "$n" ] && n=$((10#${BASH_REMATCH[1]}))
    done
    echo "$n"
  }
  for _ in $(seq 300); do [ "$(newest)" -ge 10 ] && break; sleep 0.1; done
  at=$(newest)
  [ "$at" -ge 10 ] || { scancel "$job"; cat "job-$job.out"; die "job 3: no checkpoint at step 10 or later after 30 s"; }
  [ "$at" -lt "$steps" ] || { cat "job-$job.out"; die "job 3 reached step $steps before it could be requeued"; }
  scontrol requeue "$job" || die "scontrol requeue $job failed"
  finish "srun, $steps steps, requeued after its checkpoint at step $at" 60
  out=job-$job.out
  [ "$(grep -c "^spindle-launch: job $job:" "$out")" -eq 2 ] ||
    die "job 3: expected the log of both runs in $out (--open-mode=append)"
  from=$(grep -o 'resumed from [^ ]*step-[0-9]*' "$out" | tail -n 1 | grep -o '[0-9]*$')
  [ -n "$from" ] && [ $((10#$from)) -ge "$at" ] && [ $((10#$from)) -lt "$steps" ] ||
    die "job 3: the requeued run did not resume from a checkpoint at step $at..$((steps - 1)) (got '${from:-none}')"
  grep -q "^iteration *$steps/" "$out" || die "job 3: did not reach step $steps"
  [ -d "run/checkpoints/step-$(printf %06d "$steps")" ] || die "job 3: no checkpoint at step $steps"
else
  echo "requeue part skipped: Slurm's cred_expire is ${expire:-120} s (a requeued job waits that long)"
  steps=5
fi

# 4. A rank killed with SIGKILL ends the job (srun --kill-on-bad-exit=1) and
#    srun names the task. Own run folder: the losses above stay untouched.
SPINDLE_RUN_DIR=$WORK/fault submit srun 100000 --no-requeue
for _ in $(seq 300); do [ -d fault/checkpoints/step-000004 ] && break; sleep 0.1; done
victim=""
for p in $(scontrol listpids "$job" 2> /dev/null | awk '$3 == "0" && $5 == "1" { print $1 }'); do
  grep -q spindle-run "/proc/$p/cmdline" 2> /dev/null && victim=$p
done
[ -n "$victim" ] || { scancel "$job"; cat "job-$job.out"; die "job 4: no running rank 1 found"; }
kill -9 "$victim"
job_end=$SECONDS
for _ in $(seq 100); do
  state=$(scontrol show job -o "$job" 2> /dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  [ "$state" = FAILED ] && break
  sleep 0.1
done
for _ in $(seq 20); do grep -q "task 1: Killed" "job-$job.out" && break; sleep 0.1; done
grep -v '^iteration' "job-$job.out"
[ "$state" = FAILED ] || { scancel "$job"; die "job 4 is '$state' 10 s after its rank 1 was killed, not FAILED"; }
expect "job-$job.out" "task 1: Killed" "job 4: srun did not name the killed task"
echo "job 4 FAILED $((SECONDS - job_end)) s after rank 1 was killed"

# 6. The installed tree's batch script, with no path to the repository.
installed=""
if [ -n "$BUILD" ]; then
  cmake --install "$BUILD" --prefix "$WORK/prefix" > install.log 2>&1 || { cat install.log; die "cmake --install failed"; }
  share=$WORK/prefix/share/spindle
  unset SPINDLE_ROOT SPINDLE_BIN
  SBATCH_FILE=$share/scripts/slurm/spindle.sbatch SPINDLE_RUN_DIR=$WORK/installed \
    SPINDLE_MODEL=$share/configs/models/tiny-clip.yaml SPINDLE_CLUSTER=$share/configs/clusters/cpu-1x4.yaml \
    submit mpirun 2 --no-requeue
  finish "the installed tree's spindle.sbatch, 2 steps" 40
  # The launcher prints its commands printf %q-quoted, in the C locale.
  bin_q=$(LC_ALL=C printf %q "$WORK/prefix/bin")
  grep -qF "+ $bin_q/spindle-plan " "job-$job.out" || die "job 5 did not plan with the installed spindle-plan"
  grep -qF " $bin_q/spindle-run " "job-$job.out" || die "job 5 did not run the installed spindle-run"
  [ "$(grep -c '^iteration' "job-$job.out")" -eq 2 ] || die "job 5: expected 2 iterations"
  export SPINDLE_ROOT=$SRC SPINDLE_BIN=$BIN
  installed=", runs from an installed tree"
fi
jobs_s=$((SECONDS - start))

# The reference: the same plan, trained straight, plain mpirun outside Slurm.
env -u SLURM_CONF timeout 60 mpirun -np 2 --oversubscribe "$BIN/spindle-run" run/plan.json \
  --model "$SPINDLE_MODEL" --steps "$steps" --backend cpu --seed 0 --metrics ref.jsonl > ref.log 2>&1 ||
  { cat ref.log; die "reference run failed"; }
# Every step of every job (a requeued run repeats the steps after its
# checkpoint) has the reference's losses.
"$COMPARE" --losses ref.jsonl run/metrics.jsonl || die "the Slurm jobs' losses differ from a straight run"
[ "$(grep -c '"step":'"$steps"',' run/metrics.jsonl)" -ge 1 ] || die "no metrics for step $steps"
echo "PASS: sbatch plans, trains (mpirun), resumes (srun --mpi=pmix)$([ "$steps" -gt 5 ] && echo ', survives a requeue')," \
     "ends on a killed rank$installed," \
     "has the losses of a straight $steps-step run; jobs ${jobs_s} s, total $((SECONDS - start)) s"
