#!/usr/bin/env bash
# The test command: installs what is missing, then runs every scripts/steps/NN-*.sh in name
# order (10-build builds everything, 20-ctest runs the tests, later steps add their own), stops
# at the first failing step, and prints each step's result and duration. Each step's output is
# also kept in $BUILD_DIR/test-logs/<step>.log.
#   BUILD_DIR   the build folder (default: build/ in the repository)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

export FLASHATTN_ROOT=$root
export BUILD_DIR=${BUILD_DIR:-$root/build}
# A rustup toolchain is found even when the login shell did not add it.
if [ -d "$HOME/.cargo/bin" ]; then export PATH="$HOME/.cargo/bin:$PATH"; fi

mapfile -t steps < <(LC_ALL=C ls "$root"/scripts/steps/*.sh 2>/dev/null | LC_ALL=C sort)
[ ${#steps[@]} -gt 0 ] || { echo "test.sh: no step in scripts/steps/" >&2; exit 1; }
# Setting up is the first step.
steps=("$root/scripts/install-deps.sh" "${steps[@]}")

results=() times=()
now_ms() { echo $(($(date +%s%N) / 1000000)); }
seconds() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }
summary() {
  echo
  echo "== summary =="
  printf '%-24s %-8s %10s\n' step result seconds
  local total=0 i
  for i in "${!steps[@]}"; do
    local time=""
    if [ -n "${times[$i]:-}" ]; then
      time=$(seconds "${times[$i]}")
      total=$((total + times[i]))
    fi
    printf '%-24s %-8s %10s\n' "$(basename "${steps[$i]}" .sh)" "${results[$i]:-not run}" "$time"
  done
  printf '%-24s %-8s %10s\n' total "" "$(seconds $total)"
  echo "logs: $logs"
}

logs=$BUILD_DIR/test-logs
mkdir -p "$logs"
status=0
for i in "${!steps[@]}"; do
  step=${steps[$i]}
  name=$(basename "$step" .sh)
  echo
  echo "== $name =="
  start=$(now_ms)
  if bash -euo pipefail "$step" 2>&1 | tee "$logs/$name.log"; then
    results[$i]=ok
  else
    status=$?
    results[$i]=FAILED
  fi
  times[$i]=$(($(now_ms) - start))
  [ $status -eq 0 ] || break
done
summary
exit $status
