#!/usr/bin/env bash
# A/B of kernel changes in one GPU machine call: builds this tree and the trees before each of
# a series of patches, times the forward sweep of each with cuda_benchmark (two repetitions,
# interleaved), and prints one table of TFLOP/s per shape with each variant's ratio to the first.
#
#   scripts/gpu/ab-bench.sh PATCH_DIR [-- CUDA_BENCHMARK_ARGS...]
#
# PATCH_DIR holds NN.patch files (git diff, applied in name order). v0 is this tree with every
# patch reversed, vi is v0 plus patches 1..i, the last variant is this tree itself (a folder
# without patches: the tree alone, v0). Put the
# folder where the device call carries it (an ignored folder named in `carry`, e.g. .carry/).
# CUDA_BENCHMARK_ARGS default to the forward sweep: --algo flash --fwd --no-gpt2 --dims
# 64,128,256 --seqlens 512,...,16384 --causal both.
#
# BENCH=decode times bench/compare_sdpa.py's decode cases instead (ours contiguous and paged,
# TB/s of K and V, beside cuDNN measured in the same process). REPS repetitions, interleaved
# (default 4 for cuda_benchmark: two on a machine just started read ±4 % on identical code,
# four ±0.5 %, kernel log runs 127-128; 2 for decode, whose program takes longer).
#
# TREE_BUILD=DIR takes the last variant (this tree) from a build that exists already, such as
# run-gpu-suite.sh's build-gpu, instead of building it again; BUILD_ONLY=1 builds the other
# variants and stops, so that a call can build them in the background while its tests run and
# then call again for the timings (the variants' folders are kept when their patches are the
# same, and their builds are then incremental).
#
# The variants are built with FLASHATTN_TEST_HOOKS, so FLASHATTN_TEST_FORCE_SM80=1 in the
# environment times the sm80 kernels on Hopper.
#
# Environment: OUT (where ab.txt goes; default ./gpu-out), ARCHS (default 90a), VARIANTS
# (the variants timed, e.g. "v0 v3"; default all),
# NCU ("d:seqlen:causal ..."; ncu's speed-of-light, warp-state, memory, scheduler and
# instruction sections of the last variant's main kernel on those shapes, into ncu.txt), with
# NCU_MODE (fwd, the default, or bwd: which kernel, ^fwd_kernel$ or ^bwd_kernel$) and NCU_EXTRA
# (more cuda_benchmark arguments, such as "--softcap 30").
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root" || exit 1
[ $# -ge 1 ] || { sed -n '2,30p' "${BASH_SOURCE[0]}"; exit 2; }
patch_dir=$(cd "$1" && pwd); shift
[ "${1:-}" = "--" ] && shift
bench_args=("$@")
[ ${#bench_args[@]} -eq 0 ] && bench_args=(--algo flash --fwd --no-gpt2 --dims 64,128,256
  --seqlens 512,1024,2048,4096,8192,16384 --causal both)
out=${OUT:-$root/gpu-out}
mkdir -p "$out"
t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader

# No patches: v0 is the tree, timed alone (a measurement or an ncu pass without a change).
shopt -s nullglob
patches=("$patch_dir"/*.patch)
shopt -u nullglob
n=${#patches[@]}
variants=()
for i in $(seq 0 "$n"); do variants+=("v$i"); done
dir_of() { if [ "$1" = "v$n" ]; then echo "$root"; else echo "/tmp/ab-$1"; fi; }
build_of() {
  if [ "$1" = "v$n" ] && [ -n "${TREE_BUILD:-}" ]; then (cd "$TREE_BUILD" && pwd); else echo "$(dir_of "$1")/build-ab"; fi
}
# What a variant's folder was made from: the tree's commit and status and the patches reversed.
stamp_of() {
  { git -C "$root" rev-parse HEAD 2>/dev/null; git -C "$root" status --porcelain 2>/dev/null
    for ((j = n - 1; j >= ${1#v}; j--)); do cat "${patches[$j]}"; done; } | md5sum
}
for v in "${variants[@]}"; do
  dir=$(dir_of "$v")
  if [ "$v" = "v$n" ] && [ -n "${TREE_BUILD:-}" ]; then
    [ -n "${BUILD_ONLY:-}" ] || [ -f "$TREE_BUILD/lib/libflashattn.so" ] ||
      { echo "ab-bench: no library in $TREE_BUILD"; exit 1; }
    continue
  fi
  if [ "$dir" != "$root" ] && [ "$(cat "$dir/.ab-stamp" 2>/dev/null)" != "$(stamp_of "$v")" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    tar --exclude='./build*' --exclude=./.carry -cf - . | tar -xf - -C "$dir"
    for ((j = n - 1; j >= ${v#v}; j--)); do
      (cd "$dir" && patch -s -R -p1 < "${patches[$j]}") || { echo "ab-bench: reversing ${patches[$j]} for $v failed"; exit 1; }
    done
    stamp_of "$v" > "$dir/.ab-stamp"
  fi
  { "$dir/scripts/gpu/touch-changed.sh" "$dir/build-ab" &&
    cmake -S "$dir" -B "$dir/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DFLASHATTN_CUDA_ARCHS="${ARCHS:-90a}" -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_EXAMPLES=ON \
      -DFLASHATTN_TEST_HOOKS=ON &&
    ninja -C "$dir/build-ab" flashattn cuda_benchmark; } > "/tmp/ab-build-$v.log" 2>&1 ||
    { echo "ab-bench: build of $v failed"; tail -30 "/tmp/ab-build-$v.log"; exit 1; }
  echo "built $v at $((SECONDS - t0)) s"
done
if [ -n "${BUILD_ONLY:-}" ]; then echo "ab-bench: built in $((SECONDS - t0)) s"; exit 0; fi
# An earlier invocation's results (more repetitions, other variants) must not join the table.
rm -f /tmp/ab-v*-*.json /tmp/ab-v*-*.csv
# VARIANTS="v0 v3" times only those (all are built, so that a later call can time the others).
# shellcheck disable=SC2206  # a list of names
[ -n "${VARIANTS:-}" ] && variants=(${VARIANTS})
if [ "${BENCH:-fwd}" = decode ]; then reps=${REPS:-2}; else reps=${REPS:-4}; fi
for rep in $(seq 1 "$reps"); do
  for v in "${variants[@]}"; do
    if [ "${BENCH:-fwd}" = decode ]; then
      python3 "$root/bench/compare_sdpa.py" --lib "$(build_of "$v")/lib/libflashattn.so" \
        --no-sweep --no-gpt2 --decode --out "/tmp/ab-$v-$rep.json" > "/tmp/ab-$v-$rep.log" 2>&1 ||
        echo "ab-bench: decode benchmark of $v failed"
    else
      "$(build_of "$v")/examples/cuda/cuda_benchmark" "${bench_args[@]}" \
        --csv "/tmp/ab-$v-$rep.csv" > "/tmp/ab-$v-$rep.log" 2>&1 || echo "ab-bench: benchmark of $v failed"
    fi
  done
done
if [ "${BENCH:-fwd}" = decode ]; then
python3 - "${variants[@]}" > "$out/ab.txt" <<'PY'
import glob, json, sys
vs = sys.argv[1:]
cases, cudnn, fa2 = {}, {}, {}
for v in vs:
    for f in sorted(glob.glob(f"/tmp/ab-{v}-*.json")):
        for r in json.load(open(f)).get("decode", []):
            key = (r["B"], r["Nk"], r["Nq"], r["causal"])
            for col in ("ours", "ours_paged16", "ours_paged64"):
                if r.get(col + "_TBps"):
                    cases.setdefault(key, {}).setdefault(v, {}).setdefault(col, []).append(r[col + "_TBps"])
            if r.get("cudnn_TBps"):
                cudnn.setdefault(key, []).append(r["cudnn_TBps"])
            if r.get("fa2_TBps"):
                fa2.setdefault(key, []).append(r["fa2_TBps"])
print("decode TB/s of K+V per variant, best of the repetitions: contiguous / paged 16 / paged 64; "
      "the peers' best over every run; ratio: contiguous over cuDNN")
for key in sorted(cases):
    B, Nk, Nq, causal = key
    best_cudnn = max(cudnn.get(key, [0]))
    best_fa2 = max(fa2.get(key, [0]))
    cells = []
    for v in vs:
        cols = cases[key].get(v, {})
        best = [max(cols[c]) if c in cols else 0 for c in ("ours", "ours_paged16", "ours_paged64")]
        ratio = best[0] / best_cudnn if best_cudnn else float("nan")
        cells.append("%s %.2f/%.2f/%.2f (%.2f)" % ((v,) + tuple(best) + (ratio,)))
    print("B%-3d Nk%-7d Nq%d%s  FA2 %.2f  cuDNN %.2f  %s" % (B, Nk, Nq, " causal" if causal else "",
                                                         best_fa2, best_cudnn, "  ".join(cells)))
PY
else
python3 - "${variants[@]}" > "$out/ab.txt" <<'PY'
import csv, glob, statistics, sys
vs = sys.argv[1:]
rows = {}
for v in vs:
    for f in sorted(glob.glob(f"/tmp/ab-{v}-*.csv")):
        for r in csv.DictReader(open(f)):
            if r["status"] != "ok" or float(r["tflops"]) <= 0:
                continue
            key = (r["mode"], int(r["head_dim"]), int(r["seqlen"]), r["causal"])
            rows.setdefault(key, {}).setdefault(v, []).append(float(r["tflops"]))
print("TFLOP/s per variant (each repetition), cuda_benchmark; ratio: best of each against v0's "
      "best; median: the medians' ratio")
for key in sorted(rows):
    per = rows[key]
    cells = "  ".join("%s:%s" % (v, "/".join("%.0f" % x for x in per.get(v, []))) for v in vs)
    base = max(per.get(vs[0], [0]))
    base_median = statistics.median(per[vs[0]]) if vs[0] in per else 0
    ratio = " ".join("%.3f" % (max(per[v]) / base) for v in vs[1:] if v in per and base > 0)
    median = " ".join("%.3f" % (statistics.median(per[v]) / base_median)
                      for v in vs[1:] if v in per and base_median > 0)
    print("%-6s d%-4d n%-6d causal=%-2s %s  ratio %s  median %s" % (key + (cells, ratio, median)))
PY
fi
if [ -n "${NCU:-}" ]; then
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  mode=${NCU_MODE:-fwd}
  # shellcheck disable=SC2206  # NCU_EXTRA is a list of arguments
  extra=(${NCU_EXTRA:-})
  for shape in $NCU; do
    IFS=: read -r d s c <<< "$shape"
    echo "== ncu $mode d$d n$s causal=$c ${NCU_EXTRA:-} ==" >> "$out/ncu.txt"
    # The main kernel's own name (the backward's pre- and postprocess are other kernels).
    timeout 120 "$ncu" --clock-control none -k "regex:^${mode}_kernel\$" --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section InstructionStats \
      "$(build_of "v$n")/examples/cuda/cuda_benchmark" --algo flash "--$mode" --dims "$d" \
      --seqlens "$s" --causal "$c" --no-gpt2 --reps 1 --warmup 3 "${extra[@]}" >> "$out/ncu.txt" 2>&1
  done
fi
echo "ab-bench: $((SECONDS - t0)) s"
cat "$out/ab.txt"
