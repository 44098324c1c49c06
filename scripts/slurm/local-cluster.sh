#!/usr/bin/env bash
# A single-node Slurm on this machine, for trying scripts/slurm/spindle.sbatch
# without a cluster (docs/slurm.md "A local single-node Slurm").
#
#   scripts/slurm/local-cluster.sh up      install the packages if missing (Debian:
#                                          munge slurmctld slurmd slurm-client), write
#                                          the config, start munged, slurmctld, slurmd
#   scripts/slurm/local-cluster.sh status  sinfo and squeue; exit 0 when Slurm answers
#   scripts/slurm/local-cluster.sh env     prints "export SLURM_CONF=...": eval it
#   scripts/slurm/local-cluster.sh down    cancels the jobs, stops the three daemons
#
# Everything lives in one private folder, SPINDLE_SLURM_DIR (default
# /tmp/spindle-slurm): munge key and socket, slurm.conf, spool and state
# folders, logs and pid files. Nothing outside it is written, except the
# packages `up` installs. The daemons run as root (the container's user) on
# ports SPINDLE_SLURM_PORT and +1 (default 16817, 16818), so a system Slurm on
# the default ports is not disturbed; client commands find this cluster
# through SLURM_CONF (see `env`).
#
# The node is this host with its real CPU count and memory, one partition
# "debug", no accounting, proctrack/linuxproc, task/none, select/cons_tres,
# MpiDefault=none (srun --mpi=pmix works: Debian's slurm-wlm-basic-plugins
# ships mpi_pmix_v4). It also declares SPINDLE_SLURM_GPUS (default 2) fake
# GPUs (empty files in the private folder), so the shipped batch script's
# --gpus-per-node / --gpus-per-task requests run unchanged; ranks use
# --backend cpu. For a quick turnaround a requeued job is held 10 s
# (cred_expire; default 120) and the scheduler runs every 1-2 s.
#
# Exit: 0 on success; 1 when a daemon does not come up (the log is printed) or
# `status` finds no answer; 2 on bad usage.
set -uo pipefail

DIR=${SPINDLE_SLURM_DIR:-/tmp/spindle-slurm}
PORT=${SPINDLE_SLURM_PORT:-16817}
FAKE_GPUS=${SPINDLE_SLURM_GPUS:-2}
CONF=$DIR/etc/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket
export SLURM_CONF=$CONF

say() { echo "local-cluster: $*"; }
STARTED=""  # set once `up` starts daemons: a later failure stops them again
fail() {
  echo "local-cluster: error: $*" >&2
  [ -z "$STARTED" ] || down
  exit 1
}

# answers: true when sinfo responds within 2 s.
answers() {
  [ -r "$CONF" ] && command -v sinfo > /dev/null 2>&1 && timeout 2 sinfo -h > /dev/null 2>&1
}

# stop_pid FILE NAME: ends the process whose id FILE holds (if it is alive).
stop_pid() {
  local pid
  [ -r "$1" ] || return 0
  pid=$(cat "$1")
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2> /dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2> /dev/null && kill -9 "$pid"
    say "stopped $2 (pid $pid)"
  fi
  rm -f "$1"
}

install_packages() {
  local missing=()
  command -v munged > /dev/null || missing+=(munge)
  command -v slurmctld > /dev/null || missing+=(slurmctld)
  command -v slurmd > /dev/null || missing+=(slurmd)
  command -v sbatch > /dev/null || missing+=(slurm-client)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]}"
  # policy-rc.d in containers stops the packages from starting system daemons.
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" > "$DIR/apt.log" 2>&1 ||
    { tail -n 20 "$DIR/apt.log" >&2; fail "apt-get install ${missing[*]} failed (log: $DIR/apt.log)"; }
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc --all)
  mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
  mkdir -p "$DIR/etc" "$DIR/state" "$DIR/spool/slurmd-$host" "$DIR/log" "$DIR/run"
  cat > "$CONF" << EOF
# Written by scripts/slurm/local-cluster.sh: a single-node Slurm in $DIR.
ClusterName=spindle-local
SlurmctldHost=$host
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits to restart.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
# Look for startable jobs every 1-2 s (defaults 30 and 60 s): a requeued job
# restarts as soon as its hold ends.
SchedulerParameters=bf_interval=1,sched_interval=2
# A failed node or job is not kept waiting for long on one machine.
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:$FAKE_GPUS State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  # Fake GPUs: slurmd drops GPUs without device files, so each is an empty
  # file here (task/none: nothing is bound to them; Slurm still sets
  # CUDA_VISIBLE_DEVICES for the tasks).
  mkdir -p "$DIR/dev"
  for i in $(seq 0 $((FAKE_GPUS - 1))); do : > "$DIR/dev/gpu$i"; done
  printf 'AutoDetect=off\nNodeName=%s Name=gpu File=%s/dev/gpu[0-%d]\n' "$host" "$DIR" $((FAKE_GPUS - 1)) \
    > "$DIR/etc/gres.conf"
  # PMIx client folders (spmix_appdir_*) inside DIR, not in /tmp.
  mkdir -p "$DIR/pmix"
  echo "PMIxCliTmpDirBase=$DIR/pmix" > "$DIR/etc/mpi.conf"
  # The plugin stack file of the package may name plugins we do not need.
  : > "$DIR/etc/plugstack.conf"
  echo "PlugStackConfig=$DIR/etc/plugstack.conf" >> "$CONF"
}

start_munge() {
  mkdir -p "$DIR/munge"
  chmod 700 "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/munge.key" ||
      dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none ||
      fail "cannot create the munge key"
    chmod 600 "$DIR/munge/munge.key"
  fi
  if [ -S "$MUNGE_SOCKET" ] && munge -n --socket="$MUNGE_SOCKET" < /dev/null > /dev/null 2>&1; then
    return 0
  fi
  # --force: munged refuses root-owned setups without it in some containers.
  munged --force --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
         --log-file="$DIR/log/munged.log" --pid-file="$DIR/run/munged.pid" \
         --seed-file="$DIR/munge/munged.seed" ||
    { cat "$DIR/log/munged.log" >&2; fail "munged did not start"; }
  munge -n --socket="$MUNGE_SOCKET" < /dev/null | unmunge --socket="$MUNGE_SOCKET" > /dev/null ||
    fail "munge does not round-trip a credential (log: $DIR/log/munged.log)"
}

up() {
  if answers; then
    say "already up ($CONF)"
    return 0
  fi
  mkdir -p "$DIR" && chmod 755 "$DIR" || fail "cannot create $DIR"
  install_packages
  write_config
  STARTED=1
  start_munge
  # -c: start without the jobs of an earlier run; -i: ignore a stale state.
  slurmctld -f "$CONF" -c -i || { tail -n 20 "$DIR/log/slurmctld.log" >&2; fail "slurmctld did not start"; }
  slurmd -f "$CONF" || { tail -n 20 "$DIR/log/slurmd.log" >&2; fail "slurmd did not start"; }
  local state=""
  for _ in $(seq 60); do
    state=$(timeout 2 sinfo -h -N -o '%T' 2> /dev/null | head -n 1)
    [ "$state" = idle ] && break
    sleep 0.5
  done
  if [ "$state" != idle ]; then
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2
    fail "the node is '${state:-not reported}', not idle after 30 s"
  fi
  say "up: node $(hostname -s), $(nproc --all) CPUs, $FAKE_GPUS fake GPUs; for the client commands:"
  echo "export SLURM_CONF=$CONF"
}

down() {
  if answers; then
    scancel --user="$(id -un)" 2> /dev/null || true
  fi
  stop_pid "$DIR/run/slurmd.pid" slurmd
  stop_pid "$DIR/run/slurmctld.pid" slurmctld
  stop_pid "$DIR/run/munged.pid" munged
  say "down (logs and state stay in $DIR)"
}

status() {
  if ! answers; then
    say "no answer from Slurm within 2 s (SLURM_CONF=$CONF)"
    return 1
  fi
  sinfo -N -o '%N %T %c %m %G %P'
  squeue
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up | down | status | env (docs/slurm.md)" >&2; exit 2 ;;
esac
