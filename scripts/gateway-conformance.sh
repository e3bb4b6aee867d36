#!/usr/bin/env bash
# The upstream Gateway API conformance suite, built from the Go module proxy at the version of
# the vendored CRDs (crds/gateway-api/VERSION), with the backends its manifests run.
#
#   scripts/gateway-conformance.sh build      the suite's test binary and its echo backend
#                                              (cached in ~/.cache/sluice/bin), and the echo
#                                              images under the names the suite's manifests use
#                                              (~/.cache/sluice/gateway-conformance/images)
#   scripts/gateway-conformance.sh paths      prints SUITE=, ECHO=, IMAGES= for other scripts
#
# No registry: the images are packed from the locally built echo-basic binary with
# `testcluster.sh node-image`, tagged as registry.k8s.io/gateway-api/echo-basic:<tag> for
# every tag the suite's manifests name, to be loaded into the real node's containerd
# (`testcluster.sh node-load`); the manifests set no pull policy and pin non-latest tags,
# so the kubelet uses the loaded image (IfNotPresent).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
MODDIR="$ROOT/scripts/gateway-conformance"
VERSION="$(cat "$ROOT/crds/gateway-api/VERSION")"
BIN="$SLUICE_CACHE/bin"
SUITE="$BIN/gateway-conformance-$VERSION.test"
ECHO="$BIN/gateway-echo-basic-$VERSION"
IMAGES="$SLUICE_CACHE/gateway-conformance/images-$VERSION"

log() { echo "==> gateway-conformance: $*" >&2; }
die() { echo "gateway-conformance: $*" >&2; exit 1; }

go_env() {
    env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" GOTOOLCHAIN=local \
        GOFLAGS="-trimpath -buildvcs=false -mod=readonly" CGO_ENABLED=0 "$@"
}

cmd_build() {
    command -v go >/dev/null || die "go is missing"
    grep -q "sigs.k8s.io/gateway-api/conformance $VERSION" "$MODDIR/go.mod" ||
        die "scripts/gateway-conformance/go.mod does not pin the conformance module at $VERSION"
    mkdir -p "$BIN"
    exec 9>"$BIN/.gateway-conformance.lock"
    flock 9
    if [ ! -x "$SUITE" ]; then
        log "building the conformance suite $VERSION ..."
        local t=$SECONDS
        (cd "$MODDIR" && go_env go test -c -o "$SUITE.tmp" .)
        mv -f "$SUITE.tmp" "$SUITE"
        log "built $SUITE in $((SECONDS - t))s"
    fi
    if [ ! -x "$ECHO" ]; then
        log "building echo-basic $VERSION ..."
        local t=$SECONDS
        (cd "$MODDIR" && go_env go build -o "$ECHO.tmp" sigs.k8s.io/gateway-api/conformance/echo-basic)
        mv -f "$ECHO.tmp" "$ECHO"
        log "built $ECHO in $((SECONDS - t))s"
    fi
    build_images
}

# Every echo image tag the suite's manifests name, from the module's own YAML.
echo_tags() {
    local mod
    mod="$(cd "$MODDIR" && go_env go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)"
    grep -rhoE 'image: *registry\.k8s\.io/gateway-api/echo-(basic|advanced):[^ "]+' "$mod" --include='*.yaml' |
        sed 's/^image: *//' | sort -u
}

build_images() {
    mkdir -p "$IMAGES"
    local rootfs="$IMAGES/rootfs" name tag out
    # A static Go binary is the whole root filesystem (CGO off above).
    rm -rf "$rootfs"
    mkdir -p "$rootfs/bin"
    install -m 0755 "$ECHO" "$rootfs/bin/echo-basic"
    while read -r name; do
        [ -n "$name" ] || continue
        tag="${name##*:}"
        out="$IMAGES/$(basename "${name%%:*}")-$tag.oci.tar"
        [ -s "$out" ] && continue
        # NB: echo-advanced (BackendTLS, mesh tests) is the same server with more modes
        # upstream; tests that need what echo-basic lacks are skipped with a reason.
        "$ROOT/scripts/testcluster.sh" node-image "$out" "$name" amd64 "$rootfs" /bin/echo-basic >/dev/null
        log "image $name -> $out"
    done < <(echo_tags)
    rm -rf "$rootfs"
}

case "${1:-}" in
build) cmd_build ;;
paths)
    echo "SUITE=$SUITE"
    echo "ECHO=$ECHO"
    echo "IMAGES=$IMAGES"
    ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
