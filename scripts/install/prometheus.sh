#!/usr/bin/env bash
# Builds Prometheus from the Go module proxy into
# ${SLUICE_CACHE:-$HOME/.cache/sluice}/bin/prometheus-VERSION with a `prometheus` symlink, and
# prints its path. Idempotent and cached (the Go module and build caches live under the same
# directory). The web UI's assets are not built in (the `builtinassets` tag needs the npm
# build): the HTTP API, which scripts/generate/dashboard-render.py uses, is all there.
#
# Only scripts/generate/dashboard-render.py needs it; no test does, and scripts/test.sh does not call
# it (a cold build takes minutes and a few GiB of module cache).
#
#   scripts/install/prometheus.sh     build if missing, print the binary's path
set -euo pipefail

# Prometheus 3.x is published as Go module versions v0.3MM.P (release 3.MM.P).
PROMETHEUS_MODULE_VERSION=v0.316.0

SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$SLUICE_CACHE/bin"

log() { echo "install-prometheus: $*" >&2; }
die() { log "error: $*"; exit 1; }

mkdir -p "$BIN"
exec 9>"$BIN/.install-prometheus.lock"
flock 9
target="$BIN/prometheus-$PROMETHEUS_MODULE_VERSION"
if ! [ -x "$target" ]; then
    go=$(command -v go 2>/dev/null || true)
    [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
    [ -n "$go" ] || die "no Go toolchain (go on PATH or in /usr/local/go) to build prometheus"
    gobin=$(mktemp -d "$BIN/.prometheus-build.XXXXXX")
    trap 'rm -rf "$gobin"' EXIT
    mkdir -p "$SLUICE_CACHE/go/mod" "$SLUICE_CACHE/go/build"
    log "building prometheus $PROMETHEUS_MODULE_VERSION from the Go module proxy ..."
    t0=$SECONDS
    env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" GOBIN="$gobin" \
        GOFLAGS="-trimpath -buildvcs=false" CGO_ENABLED=0 GOWORK=off \
        "$go" install -ldflags "-s -w" \
        "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_MODULE_VERSION"
    # NB: lands under its final name by `mv`, so an executable file is complete.
    mv -f "$gobin/prometheus" "$target"
    log "built prometheus $PROMETHEUS_MODULE_VERSION in $((SECONDS - t0))s"
fi
ln -sfn "prometheus-$PROMETHEUS_MODULE_VERSION" "$BIN/prometheus"
echo "$BIN/prometheus"
