#!/usr/bin/env bash
# Builds helm from the Go module proxy (pinned in scripts/install/helm/go.mod and go.sum) into
# ${SLUICE_CACHE:-$HOME/.cache/sluice}/bin/helm-VERSION with a `helm` symlink, and prints its
# path. Idempotent and cached: the Go module and build caches live under the same directory,
# so a second run takes a moment. The e2e chart tests (e2e/tests/chart.rs) run this
# helm; scripts/test.sh calls this script once before the tests.
#
#   scripts/install/helm.sh          build if missing, print the binary's path
set -euo pipefail

HELM_VERSION=v3.22.0

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODDIR="$HERE/helm"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$SLUICE_CACHE/bin"

log() { echo "install-helm: $*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=scripts/install/go.sh
. "$HERE/go.sh"

grep -qE "^\s*helm.sh/helm/v3 $HELM_VERSION( |\$)" "$MODDIR/go.mod" ||
    die "HELM_VERSION=$HELM_VERSION does not match $MODDIR/go.mod"

mkdir -p "$BIN"
exec 9>"$BIN/.install-helm.lock"
flock 9
if ! [ -x "$BIN/helm-$HELM_VERSION" ]; then
    go=$(go_toolchain 26 "helm $HELM_VERSION")
    src="$SLUICE_CACHE/helm-src-$HELM_VERSION"
    mkdir -p "$src"
    # NB: the module directory must not contain the module cache (see testcluster.sh).
    cp "$MODDIR/go.mod" "$MODDIR/go.sum" "$src/"
    # As helm's Makefile does: the Kubernetes version `helm template` and `helm lint` assume
    # without a cluster is the one of the client-go it is built with.
    kv=$(sed -n 's/^\s*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$MODDIR/go.mod")
    [ -n "$kv" ] || die "no k8s.io/client-go in $MODDIR/go.mod"
    ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    for p in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
        ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$kv"
    done
    out="$BIN/.helm-$HELM_VERSION.tmp.$$"
    log "building helm $HELM_VERSION from the Go module proxy ..."
    t0=$SECONDS
    go_build "$go" "$src" "$out" helm.sh/helm/v3/cmd/helm -ldflags "$ldflags"
    # NB: lands under its final name by `mv`, so an executable file is complete.
    mv -f "$out" "$BIN/helm-$HELM_VERSION"
    log "built helm $HELM_VERSION in $((SECONDS - t0))s"
fi
ln -sfn "helm-$HELM_VERSION" "$BIN/helm"
flock -u 9
echo "$BIN/helm-$HELM_VERSION"
