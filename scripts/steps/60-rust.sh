#!/usr/bin/env bash
# Rust binding: checks that the checked-in bindgen output (bindings/rust/flashattn-sys/src/
# bindings.rs) is what bindgen makes from the header today, then runs cargo test offline over the
# workspace (flashattn-sys: bindgen's layout tests and the bad-input catalogue; flashattn:
# numerics against f64 on the CPU backend, errors, handles; the GPU tests are ignored, and cargo
# test says so with the reason; scripts/gpu/run-bindings.sh runs them on a GPU machine) and the
# example. No crate comes from a registry.
set -euo pipefail
cd "$(dirname "$0")/../.."
. bindings/env.sh
export CARGO_TARGET_DIR="$FLASHATTN_BINDINGS_OUT/cargo"

bindings/rust/flashattn-sys/generate.sh --check
cargo test --offline --manifest-path bindings/rust/Cargo.toml
cargo run --offline --quiet --manifest-path examples/rust/Cargo.toml
