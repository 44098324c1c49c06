#!/usr/bin/env bash
# What a checkpoint's save and resume cost in host memory, per rank
# (docs/runtime.md, "Checkpoints and resume"; bench/README.md, ckpt_memory).
#
#   bench/ckpt_memory.sh [BUILD_DIR] [SPINDLE_RUN] [SPINDLE_EXPORT]
#     BUILD_DIR       default build (its apps/spindle-plan plans, and its
#                     apps/spindle-run and spindle-export run unless given)
#     SPINDLE_RUN     another spindle-run to measure with the same plan (an
#                     older build's, for a before/after)
#     SPINDLE_EXPORT  another spindle-export, likewise
#
# bench/models/big-lm.yaml (two tasks, each with its own 200000-token
# embedding and output table: 206 M parameters, 2.3 GiB of values and
# AdamW moments) planned task-level on 2 CPU ranks, so that each rank holds
# one task's parameters (the model is symmetric: half each). Three runs,
# each rank's peak resident memory
# (the rank's maximum RSS): one step; one step and a checkpoint; resuming
# that checkpoint (no step); the same three on 4 ranks; then
# spindle-export of the checkpoint. Prints the peaks,
# the bytes each rank read, and two ratios against the
# one-step run: each rank's growth at the save over the full state (value,
# m, v: 12 bytes a value) of the model's largest parameter (the 200000 x
# 256 tables), of which each rank holds, one parameter at a time, the
# parts it writes (checkpoint_file_rank: on 2 ranks rank 0 writes
# params.bin and adam_m.bin, rank 1 adam_v.bin: 2/3 and 1/3; target 1.5,
# one parameter's full state and Open MPI's buffers); and each rank's
# growth on resuming over the state it holds (its task's half), of which
# it holds one parameter's full state at a time beside its own. Files go
# to BUILD_DIR/ckpt_memory/. Takes about a minute on 2 cores, most of it
# writing and reading 2.3 GiB (fsynced).
set -eu
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/common.sh"
build="$(cd "${1:-$root/build}" && pwd)"
run_bin="${2:-$build/apps/spindle-run}"
export_bin="${3:-$build/apps/spindle-export}"
out="$build/ckpt_memory"
rm -rf "$out" && mkdir -p "$out"
cd "$out"
model="$root/bench/models/big-lm.yaml"
# cpu-1x2 with devices large enough for the model.
sed -e 's/^name: .*/name: cpu-1x2-16gib/' -e 's/memory_gib: .*/memory_gib: 16/' \
  "$root/configs/clusters/cpu-1x2.yaml" > cluster.yaml
"$build/apps/spindle-plan" "$model" --cluster cluster.yaml --strategy task-level -o plan.json > plan.log
# Each rank's peak resident memory (getrusage's ru_maxrss of the rank, in
# KiB) through python3, which scripts/setup.sh installs: GNU time is not on
# a fresh Debian.
# And the bytes it read (rchar of /proc/PID/io: read and pread calls,
# whether the page cache or the disk served them), taken once the rank has
# exited but before it is reaped.
cat > wrap.sh <<'WRAP'
#!/usr/bin/env bash
exec python3 -c '
import os, resource, subprocess, sys
p = subprocess.Popen(sys.argv[3:])
os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
io = dict(line.split(": ") for line in open("/proc/%d/io" % p.pid).read().splitlines())
rc = p.wait()
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
open(sys.argv[2], "w").write("%d\n" % int(io["rchar"]))
sys.exit(rc)' "peak.${OMPI_COMM_WORLD_RANK:-x}" "read.${OMPI_COMM_WORLD_RANK:-x}" "$@"
WRAP
chmod +x wrap.sh

# run LABEL ARGS...: spindle-run on 2 ranks; sets peak0 and peak1 (MiB)
# and read0 and read1 (bytes).
run() {
  local label="$1"; shift
  rm -f peak.0 peak.1 read.0 read.1
  if ! mpirun -np 2 --oversubscribe ./wrap.sh "$run_bin" plan.json --model "$model" --seed 1 "$@" > "$label.log" 2>&1; then
    cat "$label.log"; echo "ckpt_memory: $label failed"; exit 1
  fi
  peak0=$(( $(cat peak.0) / 1024 )); peak1=$(( $(cat peak.1) / 1024 ))
  read0=$(cat read.0); read1=$(cat read.1)
  printf '%-28s rank 0 %6d MiB, rank 1 %6d MiB at the peak; read %6d MiB, %6d MiB\n' "$label" "$peak0" "$peak1" \
    $(( read0 >> 20 )) $(( read1 >> 20 ))
}
echo "== ckpt_memory: $(basename "$model") on 2 CPU ranks, task-level; spindle-run: $run_bin"
run "one step" --steps 1
train0=$peak0 train1=$peak1 train_read0=$read0 train_read1=$read1
run "one step and a checkpoint" --steps 1 --checkpoint ck --every 1
save0=$peak0 save1=$peak1
run "resume (no step)" --steps 1 --checkpoint ck --resume
resume0=$peak0 resume1=$peak1
resume_read0=$read0 resume_read1=$read1
# The same save on 4 ranks (each task on 2, data-parallel), where each
# file has its own rank (0, 1 and 2; rank 3 writes none): each rank's peak
# over its one-step peak.
sed -e 's/^name: .*/name: cpu-1x4-16gib/' -e 's/memory_gib: .*/memory_gib: 16/' \
  "$root/configs/clusters/cpu-1x4.yaml" > cluster4.yaml
"$build/apps/spindle-plan" "$model" --cluster cluster4.yaml --strategy task-level -o plan4.json > plan4.log
run4() {   # run4 LABEL ARGS...: sets p4 (each rank's peak, MiB) and r4 (bytes read)
  local label="$1"; shift
  rm -f peak.0 peak.1 peak.2 peak.3 read.0 read.1 read.2 read.3
  if ! mpirun -np 4 --oversubscribe ./wrap.sh "$run_bin" plan4.json --model "$model" --seed 1 "$@" > "$label.log" 2>&1; then
    cat "$label.log"; echo "ckpt_memory: $label failed"; exit 1
  fi
  p4=() r4=()
  for r in 0 1 2 3; do p4+=( $(( $(cat "peak.$r") / 1024 )) ); r4+=( "$(cat "read.$r")" ); done
  printf '%-28s ranks 0-3 %s MiB at the peak\n' "$label" "${p4[*]}"
}
run4 "4 ranks: one step" --steps 1
base4=("${p4[@]}") base_read4=("${r4[@]}")
run4 "4 ranks: one step and a save" --steps 1 --checkpoint ck4 --every 1
save4=("${p4[@]}")
# And the resume on 4 ranks: each file hashed by its own rank (0, 1, 2),
# rank 3 none; each rank then reads its task's half (its values, m, v).
run4 "4 ranks: resume" --steps 1 --checkpoint ck4 --resume
resume_read4=("${r4[@]}")
rm -f peak.x read.x
if ! ./wrap.sh "$export_bin" ck -o model.safetensors > export.log 2>&1; then
  cat export.log; echo "ckpt_memory: export failed"; exit 1
fi
export_peak=$(( $(cat peak.x) / 1024 )) export_read=$(cat read.x)
printf '%-28s %6d MiB at the peak; read %6d MiB\n' "export" "$export_peak" $(( $(cat read.x) >> 20 ))
grep -H "saved checkpoint\|verified\|spindle-export:" ./*.log | sed 's/^\.\///; s/^/  /'
# Each rank holds one task's half of the model: its values, m and v are
# 3 x half of params.bin (4 bytes a value, plus the records' heads).
params_bytes=$(stat -c %s ck/step-000001/params.bin)
held=$(( params_bytes * 3 / 2 / 1048576 ))
values=$(( params_bytes / 4 ))
# The largest parameter: a 200000 x 256 table (bench/models/big-lm.yaml).
largest=$(( 200000 * 256 * 12 / 1048576 ))
awk -v s0="$save0" -v s1="$save1" -v r0="$resume0" -v r1="$resume1" -v t0="$train0" -v t1="$train1" -v h="$held" \
  -v v="$values" -v l="$largest" 'BEGIN {
  printf "model: %.1f M parameters, %d MiB of state (value, m, v) held by each rank, %d MiB its largest parameter\n", v / 1e6, h, l
  printf "save: growth over one step, rank 0 %.2f, rank 1 %.2f of the largest parameter'"'"'s state (expected 0.67 and 0.33, the parts each writes; target <= 1.5)\n", (s0 - t0) / l, (s1 - t1) / l
  printf "resume: growth over one step, rank 0 %.2f, rank 1 %.2f of the state it holds (expected 0.66: the largest parameter'"'"'s full state and a shard'"'"'s staging copy; target <= 1.2)\n", (r0 - t0) / h, (r1 - t1) / h
}'
awk -v s="${save4[*]}" -v b="${base4[*]}" -v l="$largest" 'BEGIN {
  n = split(s, sv, " "); split(b, bv, " ")
  line = "save on 4 ranks: growth over one step,"
  for (i = 1; i <= n; ++i) line = line sprintf(" rank %d %.2f", i - 1, (sv[i] - bv[i]) / l)
  print line " of the largest parameter'"'"'s state (target <= 0.34: a part of one parameter at a time, within the step'"'"'s own peak)"
}'
# The bytes each rank read at the resume beyond the one-step run's (the
# plan, the model, shared libraries), over the checkpoint's three files:
# rank 0 hashes params.bin and adam_m.bin, rank 1 adam_v.bin
# (checkpoint_file_rank), and each then reads its half's values, m
# and v: 2/3 + 1/2 and 1/3 + 1/2. Every rank hashing all three files (up
# to 148660e) read 3/3 + 1/2 each.
ck_bytes=$(( params_bytes * 3 ))
awk -v r="${resume_read4[*]}" -v b="${base_read4[*]}" -v c="$ck_bytes" 'BEGIN {
  n = split(r, rv, " "); split(b, bv, " ")
  line = "resume on 4 ranks: read over one step,"
  for (i = 1; i <= n; ++i) line = line sprintf(" rank %d %.2f", i - 1, (rv[i] - bv[i]) / c)
  print line " of the checkpoint'"'"'s files (expected 0.83 0.83 0.83 0.50: a file each on ranks 0-2, and each rank its half)"
}'
awk -v a="$resume_read0" -v b="$resume_read1" -v ta="$train_read0" -v tb="$train_read1" -v c="$ck_bytes" 'BEGIN {
  printf "resume: read over one step, rank 0 %.2f, rank 1 %.2f of the checkpoint'"'"'s %d MiB (expected 1.17 and 0.83; 1.50 each when every rank hashed every file)\n", (a - ta) / c, (b - tb) / c, c / 1048576
}'
# spindle-export holds one tensor's values at a time (the 200000 x 256
# tables, 195 MiB, the largest), no longer the model's values and the
# file's bytes besides (up to 148660e: about twice params.bin), and reads
# each file once: adam_m.bin and adam_v.bin to hash them, params.bin as
# it writes it, hashing it on the way (up to 148660e: params.bin twice).
awk -v p="$export_peak" -v l="$(( 200000 * 256 * 4 / 1048576 ))" -v m="$(( params_bytes / 1048576 ))" \
  -v r="$export_read" -v c="$ck_bytes" 'BEGIN {
  printf "export: peak %d MiB, %.2f of the largest tensor'"'"'s values (%d MiB), %.2f of the model'"'"'s (%d MiB) (target: <= 1.5 of the largest tensor)\n", p, p / l, l, p / m, m
  printf "export: read %.2f of the checkpoint'"'"'s files (target 1.00: each once; 1.33 when params.bin was read again after its hash)\n", r / c
}'
