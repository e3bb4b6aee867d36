#!/usr/bin/env bash
# Builds a minimal OpenTelemetry Collector (OTLP receiver + debug exporter, pinned in
# scripts/install/otelcol/go.mod and go.sum) from the Go module proxy into
# ${SLUICE_CACHE:-$HOME/.cache/sluice}/bin/otelcol-sluice-VERSION with an `otelcol-sluice`
# symlink, and prints its path. Idempotent and cached: the Go module and build caches live
# under the same directory, so a second run takes a moment. The dataplane's opentelemetry
# plugin tests (dataplane/tests/plugins_opentelemetry.rs) run this collector;
# scripts/test.sh calls this script once before the tests.
#
#   scripts/install/otelcol.sh          build if missing, print the binary's path
set -euo pipefail

OTELCOL_VERSION=v0.165.0

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODDIR="$HERE/otelcol"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$SLUICE_CACHE/bin"

log() { echo "install-otelcol: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/install/go.sh
. "$HERE/go.sh"

grep -qE "^\s*go.opentelemetry.io/collector/otelcol $OTELCOL_VERSION( |\$)" "$MODDIR/go.mod" ||
    die "OTELCOL_VERSION=$OTELCOL_VERSION does not match $MODDIR/go.mod"

mkdir -p "$BIN"
exec 9>"$BIN/.install-otelcol.lock"
flock 9
if ! [ -x "$BIN/otelcol-sluice-$OTELCOL_VERSION" ]; then
    go=$(go_toolchain 26 "the collector")
    src="$SLUICE_CACHE/otelcol-src-$OTELCOL_VERSION"
    mkdir -p "$src"
    # NB: the module directory must not contain the module cache (see testcluster.sh).
    cp "$MODDIR/go.mod" "$MODDIR/go.sum" "$MODDIR/main.go" "$src/"
    out="$BIN/.otelcol-sluice-$OTELCOL_VERSION.tmp.$$"
    log "building the OpenTelemetry Collector $OTELCOL_VERSION (otlp receiver, debug exporter) from the Go module proxy ..."
    t0=$SECONDS
    go_build "$go" "$src" "$out" . -ldflags "-s -w"
    # NB: lands under its final name by `mv`, so an executable file is complete.
    mv -f "$out" "$BIN/otelcol-sluice-$OTELCOL_VERSION"
    log "built the collector $OTELCOL_VERSION in $((SECONDS - t0))s"
fi
ln -sfn "otelcol-sluice-$OTELCOL_VERSION" "$BIN/otelcol-sluice"
flock -u 9
echo "$BIN/otelcol-sluice-$OTELCOL_VERSION"
