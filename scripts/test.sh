#!/usr/bin/env bash
# The Sluice test command (README; .ci/run calls exactly this).
# Installs what the tests need (idempotent, cached under ~/.cache/sluice), then runs
# formatting and lint checks and the whole cargo test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

export SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
mkdir -p "$SLUICE_CACHE"
# Build outputs live outside the clone so a fresh clone reuses them; still correct when empty.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SLUICE_CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

scripts/install-test-deps.sh
scripts/testcluster.sh install  # kube-apiserver + etcd for e2e (built once, cached)
scripts/install-helm.sh >/dev/null  # helm for the chart tests (built once from the Go module proxy, cached)

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy (unwrap/expect are denied outside tests)"
cargo clippy --workspace --all-targets --locked --quiet

echo "==> cargo build --workspace --bins (the e2e tests run these binaries)"
# NB: one build with the workspace's unified features; letting each e2e test build its
# binary with `cargo build -p <crate>` compiles the dependency tree again per crate.
cargo build --workspace --bins --locked --quiet
export SLUICE_BIN_DIR="$CARGO_TARGET_DIR/debug"

# Coverage-guided fuzzing of the dataplane's parsers (libFuzzer on stable; a fixed seed,
# 20 s a target; see scripts/fuzz.sh). A crash fails the run.
scripts/fuzz.sh --ci 20

echo "==> cargo test"
cargo test --workspace --locked --no-fail-fast
