#!/usr/bin/env bash
# Gradient all-reduces during the backward pass against after it, measured
# on CPU ranks under mpirun (docs/lowering.md, docs/simulation.md).
#
#   bench/overlap.sh [BUILD_DIR] [RANKS] [MODEL] [STEPS] [BUCKET_MB] [STRATEGY] [ROUNDS]
#     BUILD_DIR  default build        RANKS     default 2 (cluster cpu-1xRANKS)
#     MODEL      default tiny-clip    STEPS     default 30 (the first 5 are warm-up)
#     BUCKET_MB  default 0.05 (tiny models' buckets are far below DDP's 25 MiB:
#                cut small, a data-parallel plan has several to overlap)
#     STRATEGY   default sequential (data parallel, as DDP)
#     ROUNDS     default 3 (overlapped and --no-overlap runs alternate)
#
# Plans once (spindle-plan with the same --bucket-mb), then runs the plan
# ROUNDS times each way, alternating, and prints per run the median step time
# over the steps after warm-up, then the ratio of the medians
# (overlapped / --no-overlap; below 1: overlap is faster) and, from the last
# overlapped run's --trace, how many gradient all-reduce boxes (from start to
# end) overlap a backward box of the same rank. Needs python3 for the
# figures. Reported, not enforced: this machine is shared and noisy.
set -eu
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/common.sh"
build="$(cd "${1:-$root/build}" && pwd)"; ranks="${2:-2}"; model_name="${3:-tiny-clip}"; steps="${4:-30}"
bucket_mb="${5:-0.05}"; strategy="${6:-sequential}"; rounds="${7:-3}"
model="$root/configs/models/$model_name.yaml"
cluster="$root/configs/clusters/cpu-1x$ranks.yaml"
out="$build/overlap/$model_name.cpu-1x$ranks.$strategy"
mkdir -p "$out"
mpirun=(mpirun -np "$ranks" --oversubscribe)

"$build/apps/spindle-plan" "$model" --cluster "$cluster" --strategy "$strategy" --bucket-mb "$bucket_mb" \
    -o "$out/plan.json" | grep -E '^(predicted|overlap) '
"$build/apps/spindle-plan" "$model" --check "$out/plan.json" --bucket-mb "$bucket_mb" --lower "$out/programs" > /dev/null
echo "buckets per rank 0: $(grep -c '"kind":"allreduce_start"' "$out/programs/device-0.json")"
for r in $(seq "$rounds"); do
  for mode in overlap no-overlap; do
    flag=(); [ "$mode" = no-overlap ] && flag=(--no-overlap)
    rm -f "$out/$mode.$r.jsonl"
    "${mpirun[@]}" "$build/apps/spindle-run" "$out/plan.json" --model "$model" --steps "$steps" \
        --bucket-mb "$bucket_mb" --metrics "$out/$mode.$r.jsonl" --trace "$out/$mode.trace.json" "${flag[@]}" > /dev/null
  done
done
command -v python3 > /dev/null || { echo "overlap: python3 not found; the runs are in $out"; exit 0; }
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def median_step(path):
    steps = [json.loads(l) for l in open(path) if '"step_ms"' in l]
    return statistics.median(s["step_ms"] for s in steps[5:])
med = {m: [median_step(f"{out}/{m}.{r}.jsonl") for r in range(1, rounds + 1)] for m in ("overlap", "no-overlap")}
for m, v in med.items():
    print(f"{m:11s} median step ms per run: " + " ".join(f"{x:.3f}" for x in v))
o, n = statistics.median(med["overlap"]), statistics.median(med["no-overlap"])
print(f"step time, overlapped / --no-overlap: {o:.3f} / {n:.3f} ms = {o / n:.3f}")
ev = json.load(open(f"{out}/overlap.trace.json"))["traceEvents"]
box = [e for e in ev if e.get("ph") == "X"]
syncs = [e for e in box if e["cat"] == "sync"]
bwd = [e for e in box if e["cat"] == "compute" and "bwd" in e["name"]]
def overlaps(a, b):
    return a["pid"] == b["pid"] and a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]
hit = sum(any(overlaps(s, b) for b in bwd) for s in syncs)
print(f"gradient all-reduces overlapping a backward of their rank (last overlapped run): {hit} of {len(syncs)}")
EOF
