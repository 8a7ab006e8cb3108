#!/usr/bin/env bash
# The deterministic backward beside the default, in one GPU machine call: cuda_benchmark --bwd in
# both modes, repetitions interleaved, then one table of TFLOP/s per shape with the ratio of the
# best deterministic figure to the best default one (issue #14's bar: >= 0.85).
#
#   scripts/gpu/det-bench.sh [--build DIR] [--reps N] [-- CUDA_BENCHMARK_ARGS...]
#
# CUDA_BENCHMARK_ARGS default to the bf16 sweep: --algo flash --bwd --no-gpt2 --dims 64,128,256
# --seqlens 1024,2048,4096,8192,16384 --causal both (add --dtype fp16 for fp16). The build
# folder (default build-gpu) must hold examples/cuda/cuda_benchmark (run-gpu-suite.sh builds it).
# Output: the CSVs and det-bench.txt under $OUT (default ./gpu-out); the table is printed last.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
build="build-gpu"
reps=2
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift ;;
    --reps) reps=$2; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "det-bench: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--algo flash --bwd --no-gpt2 --dims "64,128,256"
  --seqlens "1024,2048,4096,8192,16384" --causal both)
bin="$build/examples/cuda/cuda_benchmark"
[ -x "$bin" ] || { echo "det-bench: no $bin (build it first)" >&2; exit 1; }
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
for rep in $(seq 1 "$reps"); do
  "$bin" "${args[@]}" --csv "$out/det-bench-default-$rep.csv" > /dev/null 2>&1 ||
    echo "det-bench: default run $rep failed"
  "$bin" "${args[@]}" --deterministic --csv "$out/det-bench-det-$rep.csv" > /dev/null 2>&1 ||
    echo "det-bench: deterministic run $rep failed"
done
python3 - "$out" "$reps" > "$out/det-bench.txt" <<'PY'
import csv, os, sys
out, reps = sys.argv[1], int(sys.argv[2])
def load(mode):
    res = {}
    for rep in range(1, reps + 1):
        path = f"{out}/det-bench-{mode}-{rep}.csv"
        if not os.path.exists(path):
            continue
        for r in csv.DictReader(open(path)):
            if r["mode"] != "bwd" or r["status"] != "ok":
                continue
            key = (r["dtype"], int(r["head_dim"]), int(r["seqlen"]), int(r["causal"]),
                   int(r["batch"]), int(r["heads"]))
            res.setdefault(key, []).append(float(r["tflops"]))
    return res
default, det = load("default"), load("det")
print("%-38s %-12s %-15s %s" % ("shape", "default", "deterministic", "best det / best default"))
ratios = []
for key in sorted(default, key=lambda k: (k[0], k[1], k[2], k[3])):
    dtype, d, n, causal, b, h = key
    a, x = default[key], det.get(key, [])
    ratio = max(x) / max(a) if x else float("nan")
    ratios.append(ratio)
    name = "b%d h%d n%d d%d%s %s" % (b, h, n, d, " causal" if causal else "", dtype)
    print("%-38s %-12s %-15s %.2f" % (name, "/".join("%.0f" % v for v in a),
                                      "/".join("%.0f" % v for v in x) or "-", ratio))
ok = [r for r in ratios if r == r]
if ok:
    print("ratio %.2f-%.2f over %d shapes, %d at >= 0.85" % (min(ok), max(ok), len(ok),
                                                          sum(r >= 0.85 for r in ok)))
PY
cat "$out/det-bench.txt"
