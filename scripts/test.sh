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
# Each stage is announced with the wall time so far, so a slow stage shows in the CI log.
step() { echo "==> [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }

# Disk: a cold run writes ~25 GiB under $SLUICE_CACHE (cargo targets, the Go module cache,
# the fuzz build, the images). When space is short, drop what is only a speed-up and is
# rebuilt on demand (incremental compilation state) before the builds fail half-way with
# "no space left on device".
free_gib() { df --output=avail -B1G "$SLUICE_CACHE" | tail -1 | tr -d ' '; }
if [ "$(free_gib)" -lt 20 ]; then
    step "only $(free_gib) GiB free under $SLUICE_CACHE: dropping incremental build state"
    rm -rf "$CARGO_TARGET_DIR"/debug/incremental "$SLUICE_CACHE"/target-image-arm64/*/ci-cross/incremental
    [ "$(free_gib)" -ge 10 ] || echo "test.sh: warning: $(free_gib) GiB free under $SLUICE_CACHE; a cold run needs ~25 GiB" >&2
fi
step "installing the test dependencies (cached under $SLUICE_CACHE)"
scripts/install/test-deps.sh
# The arm64 binaries of the test image come from Debian's rustc (the only aarch64 standard
# library here), so nothing of the amd64 build can be reused: cross-build them in the
# background (cheap profile ci-cross, see Cargo.toml; cached in
# $SLUICE_CACHE/target-image-arm64) while the stages below download and build, and pick them
# up for the image. Its packages are installed first, so no two apt-gets overlap.
scripts/images/build-images.sh --arches arm64 --tools-only
arm64_log="$SLUICE_CACHE/arm64-build.log"
# NB: in its own process group (setsid), so that a failing stage stops the whole build too.
setsid scripts/images/build-images.sh --profile ci-cross --arches arm64 --bins-only >"$arm64_log" 2>&1 &
arm64_pid=$!
trap 'kill -- "-$arm64_pid" 2>/dev/null || true' EXIT
step "arm64 binaries: cross-building in the background (log: $arm64_log)"
# kube-apiserver + etcd for e2e; with --node also the real node's parts (kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy, CoreDNS, metrics-server, containerd,
# runc, CNI plugins): built once from the Go module proxy / apt, cached.
step "kube-apiserver, etcd and the real node's parts"
scripts/cluster/testcluster.sh install --node
step "helm and the OpenTelemetry Collector"
scripts/install/helm.sh >/dev/null  # helm for the chart tests (built once from the Go module proxy, cached)
scripts/install/otelcol.sh >/dev/null  # an OpenTelemetry Collector for the opentelemetry plugin tests (built once, cached)

step "cargo fmt --check"
cargo fmt --all -- --check

# The system tier: e2e/tests/* behind the sluice-e2e `system` feature, and the tests marked
# `#[ignore = "system tier: ..."]` (a real redis-server, the collector, zsh and fish, a
# kube-apiserver). A plain `cargo test --workspace` runs neither; this script runs both.
SYSTEM_TIER=(--features sluice-e2e/system)

step "cargo clippy (unwrap/expect are denied outside tests)"
cargo clippy --workspace --all-targets --locked --quiet "${SYSTEM_TIER[@]}"

step "cargo build --workspace --bins --tests (the binaries the e2e tests run, and every test)"
# NB: one build with the workspace's unified features. The binaries are built together with
# the tests: dev-dependencies add features to shared crates (tokio's test-util, ...), so a
# `cargo build --bins` alone would compile tokio and everything above it once for the
# binaries and again for `cargo test`. Letting each e2e test build its binary with
# `cargo build -p <crate>` would compile the tree again per crate.
cargo build --workspace --bins --tests --locked --quiet "${SYSTEM_TIER[@]}"
export SLUICE_BIN_DIR="$CARGO_TARGET_DIR/debug"

# The image the real-node tests (e2e/tests/realnode.rs) install with helm: the project's own
# multi-arch build, amd64 from the binaries just built, arm64 from the background build.
step "waiting for the arm64 binaries"
if ! wait "$arm64_pid"; then
    cat "$arm64_log" >&2
    echo "the arm64 cross build failed (log above)" >&2
    exit 1
fi
arm64_bins=$(sed -n 's/^arm64 //p' "$arm64_log")
step "scripts/images/build-images.sh (amd64 from this build, arm64 from the cross build)"
scripts/images/build-images.sh --arches "amd64 arm64" --amd64-bins "$SLUICE_BIN_DIR" \
    --arm64-bins "$arm64_bins" --out "$SLUICE_CACHE/test-images"
export SLUICE_TEST_IMAGE="$SLUICE_CACHE/test-images/sluice-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1).oci.tar"

# Coverage-guided fuzzing of the dataplane's parsers (libFuzzer on stable; a fixed seed,
# 20 s a target; see scripts/fuzz.sh). A crash fails the run.
step "fuzzing"
scripts/fuzz.sh --ci 20

step "cargo test (every tier)"
cargo test --workspace --locked --no-fail-fast "${SYSTEM_TIER[@]}" -- --include-ignored || status=$?
step "done"
exit "${status:-0}"
