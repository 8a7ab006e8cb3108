#!/usr/bin/env bash
# One GPU machine call: build, run the GPU tests, benchmark, compare with PyTorch's SDPA, and
# print a short summary last. Run from anywhere inside the repository on the GPU machine:
#
#   scripts/gpu/run-gpu-suite.sh                 build + tests + bench + peers
#   scripts/gpu/run-gpu-suite.sh --tests         build + GPU tests only
#   scripts/gpu/run-gpu-suite.sh --bench --peers --quick
#   scripts/gpu/run-gpu-suite.sh --sanitize      build + gpu_tests under compute-sanitizer
#   scripts/gpu/run-gpu-suite.sh --tests --peers --flex --peers-args --decode
#                                                tests, the sweep with decode, the variants
#
# Parts: --tests (ctest -L gpu), --bench (cuda_benchmark), --peers (bench/compare_sdpa.py),
# --flex (bench/compare_flex.py: the variants beside FlexAttention and our plain causal),
# --sanitize (compute-sanitizer on gpu_tests). None given: tests, bench and peers. The build
# always runs first; it is incremental, so a second call on a still-warm machine skips it.
# The summary checks bench/targets.py's targets against what peers and flex measured.
#
# Options:
#   --quick             reduced shapes for bench and peers (seqlen 1k/4k/16k, d 64/128)
#   --archs LIST        FLASHATTN_CUDA_ARCHS (default 90a)
#   --build DIR         build folder (default build-gpu)
#   --require-flash     export FLASHATTN_REQUIRE_FLASH=1 (flash unsupported = test failure);
#                       an inherited FLASHATTN_REQUIRE_FLASH is passed through as well
#   --budget SECONDS    total wall-clock budget (default 570: under a 600 s call limit); each
#                       part gets its own limit, cut to what is left, and the summary still
#                       prints when a part is cut
#   --bench-args "..."  extra arguments for cuda_benchmark; --peers-args "..." and
#                       --flex-args "..." likewise
#
# Output: logs under $OUT (or ./gpu-out when OUT is unset): build.log tests.log bench.log
# bench.csv peers.log peers.json flex.log flex.json sanitize.log summary.txt, those of the parts
# run (a device call brings back eight files at most: all parts at once make ten).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

out=${OUT:-$root/gpu-out}
mkdir -p "$out"
build="build-gpu"
archs="90a"
quick=0
budget=570
do_tests=0 do_bench=0 do_peers=0 do_flex=0 do_sanitize=0
bench_args="" peers_args="" flex_args=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) do_tests=1 ;;
    --bench) do_bench=1 ;;
    --peers) do_peers=1 ;;
    --flex) do_flex=1 ;;
    --sanitize) do_sanitize=1 ;;
    --quick) quick=1 ;;
    --archs) archs=$2; shift ;;
    --build) build=$2; shift ;;
    --require-flash) export FLASHATTN_REQUIRE_FLASH=1 ;;
    --budget) budget=$2; shift ;;
    --bench-args) bench_args=$2; shift ;;
    --peers-args) peers_args=$2; shift ;;
    --flex-args) flex_args=$2; shift ;;
    -h|--help) sed -n '2,34p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run-gpu-suite: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ $((do_tests + do_bench + do_peers + do_flex + do_sanitize)) -eq 0 ]; then
  do_tests=1 do_bench=1 do_peers=1
fi

start=$SECONDS
declare -A result seconds_of
order=()
summary_lines=()

left() { echo $((budget - (SECONDS - start))); }
# A part's limit: its own, cut to the budget left minus a reserve for the parts after it.
limit() {
  local want=$1 reserve=$2 l
  l=$(($(left) - reserve))
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
# run_part NAME LIMIT LOG COMMAND...: runs under timeout, records the result and duration.
run_part() {
  local name=$1 lim=$2 log=$3
  shift 3
  order+=("$name")
  local t0=$SECONDS rc
  echo "== $name (limit ${lim}s) =="
  timeout --kill-after=10 "$lim" "$@" >"$log" 2>&1
  rc=$?
  seconds_of[$name]=$((SECONDS - t0))
  case $rc in
    0) result[$name]=ok ;;
    77) result[$name]="skipped (no GPU)" ;;
    124|137) result[$name]="TIMED OUT (${lim}s)" ;;
    *) result[$name]="FAILED (exit $rc)" ;;
  esac
  echo "   ${result[$name]} in ${seconds_of[$name]}s; log: $log"
  tail -n 3 "$log" | sed 's/^/   | /'
  return $rc
}

echo "run-gpu-suite: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), repo $(git -C "$root" rev-parse --short HEAD 2>/dev/null)$(git -C "$root" diff --quiet 2>/dev/null || echo '+dirty'), build $build, archs $archs, budget ${budget}s"
gpu_line=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv,noheader 2>&1 | head -n 1)
echo "GPU: $gpu_line"
echo "FLASHATTN_REQUIRE_FLASH=${FLASHATTN_REQUIRE_FLASH:-0}"
summary_lines+=("GPU: $gpu_line")

# ---- build ----
# shellcheck disable=SC2317  # run through bash -c below
build_cmd() {
  set -e
  "$root/scripts/gpu/touch-changed.sh" "$build"  # a file sent back as it was is rebuilt too
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DFLASHATTN_CUDA_ARCHS="$archs" -DFLASHATTN_TEST_HOOKS=ON -DFLASHATTN_CUDA_LINEINFO=ON \
    -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_EXAMPLES=ON
  # Everything: on 16 cores the whole tree builds in well under a minute, and a test executable
  # left unbuilt would show up as "Not Run".
  ninja -C "$build" -j "$(nproc)"
}
export -f build_cmd
export root build archs
run_part build "$(limit 330 60)" "$out/build.log" bash -c build_cmd
build_ok=$?
lib=$(ls "$build"/lib/libflashattn.so 2>/dev/null)
bench_bin=$(ls "$build"/examples/cuda/cuda_benchmark 2>/dev/null)

# ---- GPU tests ----
if [ $do_tests -eq 1 ]; then
  if [ $build_ok -eq 0 ]; then
    # The three gpu_tests suites and any other gpu-labelled test run side by side; -V keeps
    # what passing tests print (device banner, flash availability, doctest counts).
    # Then the sweeps and the variants once more with the mma.sync (sm80) kernels forced, so a
    # Hopper machine tests both kernel families (the variant suites take seconds).
    tests_cmd() {
      ctest --test-dir "$build" -L gpu -j 4 -V --timeout 600
      local rc=$?
      echo "== forward and backward sweeps and the variants with FLASHATTN_TEST_FORCE_SM80=1 =="
      FLASHATTN_TEST_FORCE_SM80=1 "$build/tests/gpu/gpu_tests" \
        --test-suite='gpu_forward,gpu_backward,gpu_variants*' || rc=1
      return $rc
    }
    export -f tests_cmd
    run_part tests "$(limit 240 $((do_bench * 60 + do_peers * 90 + do_flex * 120 + do_sanitize * 60)))" "$out/tests.log" \
      bash -c tests_cmd
  else
    order+=(tests); result[tests]="not run (build failed)"
  fi
  line=$(grep -E 'tests passed|No tests were found' "$out/tests.log" 2>/dev/null | tail -n 1)
  failed=$(sed -n '/The following tests FAILED/,/^$/p' "$out/tests.log" 2>/dev/null | grep -E '^\s+[0-9]+ - ' | sed 's/^ */  /')
  skipped=$(sed -n '/The following tests did not run/,/^$/p' "$out/tests.log" 2>/dev/null | grep -E '^\s+[0-9]+ - ' | sed 's/^ */  /')
  flash=$(grep -h 'flash algorithm not available' "$out/tests.log" 2>/dev/null | sort -u | head -n 4)
  counts=$(grep -h 'test cases:' "$out/tests.log" 2>/dev/null | head -n 6)
  summary_lines+=("tests: ${line:-no ctest summary (see tests.log)}")
  [ -n "$failed" ] && summary_lines+=("failed:" "$failed")
  [ -n "$skipped" ] && summary_lines+=("skipped:" "$skipped")
  [ -n "$counts" ] && summary_lines+=("$counts")
  [ -n "$flash" ] && summary_lines+=("$flash")
fi

# ---- compute-sanitizer ----
if [ $do_sanitize -eq 1 ]; then
  if [ $build_ok -ne 0 ]; then
    order+=(sanitize); result[sanitize]="not run (build failed)"
  elif [ -x "$root/scripts/gpu/compute-sanitizer.sh" ] || [ -f "$root/scripts/gpu/compute-sanitizer.sh" ]; then
    export BUILD_DIR=$root/$build
    run_part sanitize "$(limit 400 $((do_bench * 60 + do_peers * 90 + do_flex * 120)))" \
      "$out/sanitize.log" bash "$root/scripts/gpu/compute-sanitizer.sh"
  else
    # memcheck over gpu_tests, the 4224-long cases left out (the rest is the same code).
    run_part sanitize "$(limit 400 $((do_bench * 60 + do_peers * 90 + do_flex * 120)))" "$out/sanitize.log" \
      "${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}" \
      --tool memcheck --error-exitcode 1 --leak-check no \
      "$build/tests/gpu/gpu_tests" --test-case-exclude='*large*'
  fi
  summary_lines+=("sanitize: $(grep -E 'ERROR SUMMARY|test cases:' "$out/sanitize.log" 2>/dev/null | tail -n 2 | tr '\n' ' ')")
fi

# ---- benchmark ----
if [ $do_bench -eq 1 ]; then
  if [ -n "$bench_bin" ]; then
    args=(--csv "$out/bench.csv")
    [ $quick -eq 1 ] && args+=(--quick)
    # shellcheck disable=SC2206
    args+=($bench_args)
    run_part bench "$(limit 200 $((do_peers * 90 + do_flex * 120)))" "$out/bench.log" "$bench_bin" "${args[@]}"
  else
    order+=(bench); result[bench]="not run (no cuda_benchmark binary)"
  fi
fi

# ---- PyTorch SDPA peers ----
if [ $do_peers -eq 1 ]; then
  if [ -n "$lib" ]; then
    args=(--lib "$lib" --out "$out/peers.json")
    [ $quick -eq 1 ] && args+=(--quick)
    # shellcheck disable=SC2206
    args+=($peers_args)
    run_part peers "$(limit 300 $((15 + do_flex * 120)))" "$out/peers.log" python3 "$root/bench/compare_sdpa.py" "${args[@]}"
  else
    order+=(peers); result[peers]="not run (no libflashattn.so)"
  fi
fi

# ---- the variants beside FlexAttention ----
if [ $do_flex -eq 1 ]; then
  if [ -n "$lib" ]; then
    args=(--lib "$lib" --out "$out/flex.json")
    # shellcheck disable=SC2206
    args+=($flex_args)
    run_part flex "$(limit 300 15)" "$out/flex.log" python3 "$root/bench/compare_flex.py" "${args[@]}"
  else
    order+=(flex); result[flex]="not run (no libflashattn.so)"
  fi
fi

# ---- summary (also written to summary.txt) ----
{
  echo
  echo "== summary ($((SECONDS - start))s) =="
  for name in "${order[@]}"; do
    printf '  %-9s %-26s %5ss\n' "$name" "${result[$name]}" "${seconds_of[$name]:-}"
  done
  for l in "${summary_lines[@]}"; do echo "$l"; done
  if [ -s "$out/bench.csv" ] || [ -s "$out/peers.json" ]; then
    python3 - "$out/bench.csv" "$out/peers.json" <<'PY'
import csv, json, os, sys
bench, peers = sys.argv[1], sys.argv[2]
if os.path.exists(bench) and os.path.getsize(bench) > 0:
    rows = list(csv.DictReader(open(bench)))
    def pick(label, d, n, causal, algo, mode):
        for r in rows:
            if (r["label"], r["head_dim"], r["seqlen"], r["causal"], r["algo"], r["mode"]) == (label, str(d), str(n), str(causal), algo, mode):
                return r
    print("bench (TFLOP/s flash | standard; fwd / bwd):")
    for d, n in ((64, 1024), (64, 16384), (128, 4096), (128, 16384), (256, 16384)):
        for causal in (0, 1):
            cells = []
            for algo in ("flash", "standard"):
                f, b = pick("sweep", d, n, causal, algo, "fwd"), pick("sweep", d, n, causal, algo, "bwd")
                fmt = lambda r: (f"{float(r['tflops']):.0f}" if r and r["status"] == "ok" else "n/a")
                cells.append(f"{fmt(f)}/{fmt(b)}")
            if any(c != "n/a/n/a" for c in cells):
                print(f"  d{d} n{n}{' causal' if causal else ''}: " + " | ".join(cells))
    for causal in (0, 1):
        f, s = pick("gpt2-medium", 64, 1024, causal, "flash", "fwdbwd"), pick("gpt2-medium", 64, 1024, causal, "standard", "fwdbwd")
        ok = lambda r: r is not None and r["status"] == "ok"
        if ok(f) or ok(s):
            fm = f"{float(f['ms']):.2f} ms" if ok(f) else "n/a"
            sm = f"{float(s['ms']):.2f} ms" if ok(s) else "n/a"
            sp = f", {float(s['ms']) / float(f['ms']):.1f}x" if ok(f) and ok(s) else ""
            print(f"  GPT-2 medium fwd+bwd{' causal' if causal else ''}: flash {fm}, standard {sm}{sp}")
if os.path.exists(peers) and os.path.getsize(peers) > 0:
    data = json.load(open(peers))
    rs = data.get("sweep", [])
    def ratios(key_ours, key_peer):
        v = [r[key_ours] / r[key_peer] for r in rs if r.get("algo") == "flash" and r.get(key_ours) and r.get(key_peer)]
        return (f"{min(v):.2f}..{max(v):.2f} (mean {sum(v) / len(v):.2f}, {len(v)} shapes)") if v else "n/a"
    print("peers: ours(flash)/FA2 fwd " + ratios("ours_fwd_tflops", "fa2_fwd_tflops") +
          "; bwd " + ratios("ours_bwd_tflops", "fa2_bwd_tflops"))
    print("       ours(flash)/cuDNN fwd " + ratios("ours_fwd_tflops", "cudnn_fwd_tflops") +
          "; bwd " + ratios("ours_bwd_tflops", "cudnn_bwd_tflops"))
    diffs = [r["max_abs_diff_vs_fa2"] for r in rs if r.get("max_abs_diff_vs_fa2") is not None]
    if diffs:
        print(f"       max |ours - FA2| over shapes: {max(diffs):.3g}")
    for g in data.get("gpt2_medium", []):
        ms = g.get("fwdbwd_ms")
        mem = g.get("peak_extra_bytes")
        print(f"  GPT-2 {g['name']:<22} {'causal' if g['causal'] else 'full  '}: "
              f"{(f'{ms:.2f} ms' if ms else 'n/a'):>10}  {(f'{mem / 1e9:.2f} GB' if mem is not None else 'n/a'):>9}")
PY
  fi
  targets_args=()
  [ -s "$out/peers.json" ] && targets_args+=(--peers "$out/peers.json")
  [ -s "$out/flex.json" ] && targets_args+=(--flex "$out/flex.json")
  if [ ${#targets_args[@]} -gt 0 ]; then
    echo "targets: $(python3 "$root/bench/targets.py" "${targets_args[@]}" | tail -1)" \
      "(the misses: python3 bench/targets.py ${targets_args[*]/#$out\//} --misses-only)"
  fi
  echo "logs: $out"
} | tee "$out/summary.txt"

for name in "${order[@]}"; do
  [ "${result[$name]}" = ok ] || exit 1
done
exit 0
