#!/usr/bin/env bash
# Go binding: checks that the checked-in SWIG output (bindings/go/capi/capi.go, capi_wrap.c) is
# what swig makes from the interface today, then runs go test (numerics against float64 on the
# CPU backend, fp16/bf16 conversions, the bad-input catalogue through package capi; the GPU tests
# skip without a device, saying why) and the example. No module comes from outside the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bindings/env.sh
export GOFLAGS=-mod=mod GOPROXY=off
# A build cache of this build's own: go's cache does not notice that pkg-config now names
# another library folder, so a package built for another BUILD_DIR would link against that.
export GOCACHE=$FLASHATTN_BINDINGS_OUT/go-cache

bindings/go/generate.sh --check
# -v, for go test names a skipped test and its reason only then; the whole log is shown on a
# failure, else the skips and each package's verdict.
log=$FLASHATTN_BINDINGS_OUT/go-test.log
if ! (cd bindings/go && go test -count=1 -v ./...) >"$log" 2>&1; then
  cat "$log"
  exit 1
fi
grep -B1 -- '^--- SKIP' "$log" | grep -v -e '^--$' -e '^=== RUN' || true  # reason, then name
grep -E '^(ok|FAIL)' "$log"
(cd examples/go && go run .)
