#!/usr/bin/env bash
# Go binding: checks that the checked-in SWIG output (bindings/go/capi/capi.go, capi_wrap.c) is
# what swig makes from the interface today, then runs go test (numerics against float64 on the
# CPU backend, fp16/bf16 conversions, the bad-input catalogue through package capi; the GPU tests
# skip without a device) and the example. No module comes from outside the repository.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bindings/env.sh
export GOFLAGS=-mod=mod GOPROXY=off

bindings/go/generate.sh --check
(cd bindings/go && go test -count=1 ./...)
(cd examples/go && go run .)
