#!/usr/bin/env bash
# Command-line checks of spindle-profile --measure (run by ctest).
# Usage: profile_checks.sh MODE BIN_DIR SOURCE_DIR OUT_DIR MPIEXEC
#   measure-and-plan  a measured tiny-clip profile (3 device counts, short
#                     budget) is written, shows progress and the fit check,
#                     and spindle-plan plans with it
#   mpi-links         under mpirun -np 2 the profile carries measured links
#                     (x-links) and the executor's own overhead, and
#                     spindle-plan plans with it
#   bad-usage         every bad usage exits 2 naming the problem, output untouched
#                     (a --devices list that would give a one-point entry too)
set -u
mode="$1"; bin="$2"; src="$3"; out="$4/$mode"; mpiexec="$5"
model="$src/configs/models/tiny-clip.yaml"
expect="$src/test/cli/expect_invalid.sh"
rm -rf "$out"; mkdir -p "$out"
fail() { echo "FAIL: $*"; exit 1; }
# same_figure SAID WRITTEN DECIMALS: the figure a line printed with
# DECIMALS decimals is the one the profile wrote (itself rounded to 4
# decimals): within half a unit of the last printed place and the file's
# own rounding. (Compared as text after rounding both, 50.3905 written
# read 50.391 against 50.390 said, the same value rounded twice.)
same_figure() {
  [ -n "$1" ] && [ -n "$2" ] &&
    awk -v a="$1" -v b="$2" -v k="$3" 'BEGIN { t = 0.5 * 10 ^ -k + 0.5e-4 + 1e-9; d = a - b; exit !(d <= t && d >= -t) }'
}

case "$mode" in
measure-and-plan)
  "$bin/spindle-profile" "$model" --cluster "$src/configs/clusters/cpu-1x4.yaml" --measure \
      --devices 1,2,4 --point-ms 5 -o "$out/p.json" >"$out/stdout" 2>"$out/stderr" || fail "profile exit $?"
  cat "$out/stdout"
  grep -q '"source": "measured"' "$out/p.json" || fail "source is not measured"
  grep -q '"x-spread"' "$out/p.json" || fail "no spread written"
  grep -q '"version": 1,' "$out/p.json" || fail "not a version 1 profile (the format docs/spec/profile.md fixes)"
  grep -q 'fit check: curve error on [0-9]* left-out interior points' "$out/stdout" || fail "no fit check"
  grep -q '^spread:' "$out/stdout" || fail "no spread summary"
  grep -q '\[[0-9]*/[0-9]*\] .* s left' "$out/stderr" || fail "no progress line: $(cat "$out/stderr")"
  "$bin/spindle-plan" "$model" --cluster "$src/configs/clusters/cpu-1x4.yaml" --profile "$out/p.json" \
      -o "$out/plan.json" >"$out/plan.out" || fail "plan exit $?"
  "$bin/spindle-plan" --model "$model" --check "$out/plan.json" --profile "$out/p.json" | grep -q valid \
      || fail "plan does not check"
  ;;
mpi-links)
  "$mpiexec" -np 2 --oversubscribe "$bin/spindle-profile" "$model" --cluster "$src/configs/clusters/cpu-1x2.yaml" \
      --measure --point-ms 5 -o "$out/p.json" >"$out/stdout" 2>"$out/stderr" || fail "profile exit $?: $(cat "$out/stderr")"
  cat "$out/stdout"
  grep -q '"x-links"' "$out/p.json" || fail "no x-links"
  # The CPU backend's all-reduces go over MPI: they progress inside calls only.
  grep -q '"progress":"calls"' "$out/p.json" || fail "x-links does not say all-reduces progress inside calls"
  # The optimizer step's rate, timed (docs/profiling.md).
  grep -q '"x-optimizer": {"gbytes_per_s":[0-9.e+-]*}' "$out/p.json" || fail "no x-optimizer rate"
  grep -q '^optimizer: AdamW over [0-9]* values per rank, [0-9.e+-]* GB/s' "$out/stdout" \
      || fail "no optimizer summary line"
  # The executor's own overhead, fitted from a few training steps of a plan
  # of the model (calibrate.h): its figures written, and said.
  grep -q '"instruction_us":[0-9.e+-]*' "$out/p.json" || fail "no instruction_us: $(grep -A1 comm_overhead "$out/p.json")"
  grep -q "^overhead: the executor's own, from [0-9]* instructions of [0-9]* steps of a plan of the model: " \
      "$out/stdout" || fail "no executor overhead line: $(grep '^overhead' "$out/stdout")"
  # ZeRO-1's reduce-scatter and all-gather, fitted from the same plan trained
  # sharded: written, and said with the figures written.
  for key in reduce_scatter_us allgather_us; do
    grep -q "\"$key\":[0-9.e+-]*" "$out/p.json" || fail "no $key: $(grep -A1 comm_overhead "$out/p.json")"
  done
  said=$(sed -n "s/^overhead: the executor's own.*; ZeRO-1 reduce-scatter \([0-9.]*\) us, all-gather \([0-9.]*\) us per call ([0-9]* steps sharded).*/\1 \2/p" "$out/stdout")
  [ -n "$said" ] || fail "no ZeRO-1 figures said: $(grep '^overhead: the' "$out/stdout")"
  figure() { sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p" "$out/p.json" | head -n 1; }
  same_figure "${said% *}" "$(figure reduce_scatter_us)" 2 || fail "ZeRO-1 reduce-scatter said (${said% *} us) is not the one written ($(figure reduce_scatter_us))"
  same_figure "${said#* }" "$(figure allgather_us)" 2 || fail "ZeRO-1 all-gather said (${said#* } us) is not the one written ($(figure allgather_us))"
  # The optimizer's rate as the executor's steps ran it replaces the one
  # timed alone: said, with the figure written.
  opt=$(sed -n "s/^overhead: the executor's own.*; optimizer \([0-9.]*\) GB\/s in its steps (timed alone: [0-9.]* GB\/s).*/\1/p" "$out/stdout")
  [ -n "$opt" ] || fail "no optimizer rate in its steps said: $(grep '^overhead: the' "$out/stdout")"
  written=$(sed -n 's/.*"x-optimizer": {"gbytes_per_s":\([0-9.e+-]*\)}.*/\1/p' "$out/p.json")
  same_figure "$opt" "$written" 2 || fail "optimizer rate said ($opt GB/s) is not the one written ($written)"
  # The operators inside the executor's steps against their times alone:
  # said, and written as the profile's x-compute with the factor said (on
  # 2 CPU ranks 1.09-1.13 on 2026-12-06; the line says when a factor
  # outside 0.5-2 was left out, and then nothing is written).
  scale=$(sed -n 's/^compute: in [0-9]* steps of a plan of the model the operators took \([0-9.]*\)x their times alone ([0-9]* forward and backward instructions over the ranks).*/\1/p' "$out/stdout")
  if [ -n "$scale" ]; then
    written=$(sed -n 's/.*"x-compute": {"in_step_scale":\([0-9.e+-]*\)}.*/\1/p' "$out/p.json")
    same_figure "$scale" "$written" 3 || fail "compute scale said ($scale) is not the one written ($written)"
  else
    grep -q '^compute: as timed alone; in [0-9]* steps .* not applied: ' "$out/stdout" ||
      fail "no compute line: $(grep '^compute' "$out/stdout")"
    grep -q '"x-compute"' "$out/p.json" && fail "x-compute written though not applied"
  fi
  grep -q 'intra_island send/recv' "$out/stdout" || fail "no link figures printed"
  grep -q 'intra_island all-reduce' "$out/stdout" || fail "no all-reduce figures printed"
  # When the executor's buckets gave the all-reduce's rate (fixed cost 0),
  # that rate is the profile's (the links line prints what was written).
  rate=$(sed -n "s/^overhead: the executor's own.*all-reduce 0.00 us per call at \([0-9.]*\) GB\/s in its buckets.*/\1/p" "$out/stdout")
  if [ -n "$rate" ]; then
    link=$(sed -n 's/^links: *intra_island all-reduce *\([0-9.]*\) GB\/s.*/\1/p' "$out/stdout")
    awk -v a="$rate" -v b="$link" 'BEGIN { exit !(b != "" && a - b < 0.006 && b - a < 0.006) }' \
        || fail "the executor's all-reduce rate $rate GB/s is not the profile's ($link)"
  fi
  # CPU ranks time each point of 2 or more devices together (MeasureOptions::together):
  # tiny-clip's 17 entries at 1, 2 devices, so 17 of its 34 points.
  grep -q '^operators: 34 points on 2 rank(s) (17 of them on min(n, ranks) ranks at once)' "$out/stdout" \
      || fail "points of 2 devices not timed on both ranks: $(grep '^operators' "$out/stdout")"
  [ "$(grep -c '^spindle-profile: .* entries' "$out/stdout")" = 1 ] || fail "summary not printed exactly once"
  "$bin/spindle-plan" "$model" --cluster "$src/configs/clusters/cpu-1x2.yaml" --profile "$out/p.json" \
      -o "$out/plan.json" >"$out/plan.stdout" || fail "plan exit $?"
  grep -q '^links     measured by the profile (x-links, 2 ranks): in an island p2p [0-9.]* GB/s' "$out/plan.stdout" \
      || fail "spindle-plan does not say it uses the measured links"
  grep -q '^links .*all-reduces move only inside MPI calls and polls (progress: calls)$' "$out/plan.stdout" \
      || fail "spindle-plan does not say how the all-reduces progress"
  # And the operators' in-step scale it prices with, the one written.
  if [ -n "$scale" ]; then
    grep -q "^compute   the profile's operator times x $scale, as they ran inside training steps (x-compute)$" \
        "$out/plan.stdout" || fail "spindle-plan does not say it scales the operators by $scale: $(grep '^compute' "$out/plan.stdout")"
  fi
  # Islands of one device: no two ranks exchange within one, but the copies
  # are timed all the same, and their rate is the profile's (it kept the
  # analytic 5 GB/s without a word).
  sed -e 's/^islands: 1/islands: 2/' -e 's/^devices_per_island: 2/devices_per_island: 1/' -e 's/^name: cpu-1x2/name: cpu-2x1/' \
      "$src/configs/clusters/cpu-1x2.yaml" > "$out/c2x1.yaml"
  "$mpiexec" -np 2 --oversubscribe "$bin/spindle-profile" "$model" --cluster "$out/c2x1.yaml" \
      --measure --point-ms 5 --devices 1,2 -o "$out/p21.json" >"$out/stdout21" 2>"$out/stderr21" ||
    fail "profile of islands of one device: exit $?: $(cat "$out/stderr21")"
  said=$(sed -n 's/^overhead: timed alone: packing \([0-9.]*\) GB\/s (copy [0-9.]* us), all-reduce .*; exchange .* analytic$/\1/p' "$out/stdout21")
  [ -n "$said" ] || fail "islands of one device: no packing rate said: $(grep '^overhead' "$out/stdout21")"
  written=$(sed -n 's/.*"pack_gbytes_per_s":\([0-9.e+-]*\).*/\1/p' "$out/p21.json")
  same_figure "$said" "$written" 3 || fail "islands of one device: packing $said GB/s said, $written written"
  ;;
bad-usage)
  p="$bin/spindle-profile"; c4="$src/configs/clusters/cpu-1x4.yaml"; o="$out/o.json"
  status=0
  bash "$expect" "$o" "--analytic excludes --measure" -- "$p" "$model" --cluster "$c4" --measure --analytic -o "$o" || status=1
  # Without a usable GPU --backend cuda is refused (not built, or no device).
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    bash "$expect" "$o" "--backend cuda" "built: cpu" -- "$p" "$model" --cluster "$c4" --measure --backend cuda -o "$o" || status=1
  fi
  for ms in 0 -1 nan inf 1e400; do
    bash "$expect" "$o" "--point-ms" -- "$p" "$model" --cluster "$c4" --measure --point-ms "$ms" -o "$o" || status=1
  done
  bash "$expect" "$o" "device count 9" -- "$p" "$model" --cluster "$c4" --measure --devices 9 -o "$o" || status=1
  # More ranks than the cluster has devices: rank 2 of one-island cpu-1x2
  # would time "inter_island" links the cluster lacks. Refused by every
  # rank before anything is timed.
  bash "$expect" "$o" "3 ranks, but cluster cpu-1x2" "has 2 devices: run at most one rank per device (mpirun -np 2 or fewer)" -- \
    "$mpiexec" -np 3 --oversubscribe "$p" "$model" --cluster "$src/configs/clusters/cpu-1x2.yaml" --measure -o "$o" ||
    status=1
  # One count where the cluster allows several: spindle-plan would refuse
  # the profile (one point), so neither mode writes it.
  for how in --analytic --measure; do
    bash "$expect" "$o" "gets one point (2 devices), but 1,2,3,4 are valid" -- \
      "$p" "$model" --cluster "$c4" "$how" --devices 2 -o "$o" || status=1
  done
  bash "$expect" "$o" "--devices" -- "$p" "$model" --cluster "$c4" --measure --devices 2,x -o "$o" || status=1
  bash "$expect" "$o" "--backend" -- "$p" "$model" --cluster "$c4" --backend cpu -o "$o" || status=1
  bash "$expect" "$o" "does not exist" -- "$p" "$model" --cluster "$c4" --measure -o "$out/missing/dir/p.json" || status=1
  bash "$expect" "$o" "unknown-op.yaml" "modules.vision[1].op" -- \
      "$p" "$src/test/data/models/bad/unknown-op.yaml" --cluster "$c4" --measure -o "$o" || status=1
  bash "$expect" "$o" "cpu-1x4.yaml" -- "$p" "$model" --cluster "$src/configs/clusters/cpu-1x4.yaml.missing" --measure -o "$o" || status=1
  # Under mpirun every rank reads the same line: a bad one is said once
  # (it was said by every rank), and a long --devices list not echoed whole.
  c2="$src/configs/clusters/cpu-1x2.yaml"
  "$mpiexec" -np 2 --oversubscribe "$p" "$model" --cluster "$c2" --measure --point-ms abc -o "$o" > "$out/twice" 2>&1
  rc=$?
  [ "$rc" = 2 ] && [ "$(grep -c 'Could not convert' "$out/twice")" = 1 ] ||
    { echo "FAIL: a bad --point-ms under 2 ranks: exit $rc, said $(grep -c 'Could not convert' "$out/twice") times"; status=1; }
  long="1,$(printf '9%.0s' $(seq 1 300))"
  "$mpiexec" -np 2 --oversubscribe "$p" "$model" --cluster "$c2" --measure --devices "$long" -o "$o" > "$out/twice" 2>&1
  rc=$?
  [ "$rc" = 2 ] && [ "$(grep -c 'error: --devices' "$out/twice")" = 1 ] && grep -q "found '1,9\{75\}\.\.\.'" "$out/twice" ||
    { echo "FAIL: a bad --devices under 2 ranks: exit $rc: $(head -c 300 "$out/twice")"; status=1; }
  exit $status
  ;;
*) fail "unknown mode $mode" ;;
esac
echo "ok: $mode"
