#!/usr/bin/env bash
# The upstream Gateway API conformance suite, built from the Go module proxy at the version of
# the vendored CRDs (crds/gateway-api/VERSION), with the backends its manifests run, and run
# against Sluice installed by its chart on the real test node (scripts/cluster/testcluster.sh --node).
#
#   scripts/conformance/gateway-conformance.sh run         the one command: build what is missing, start
#                                              a node, install Sluice, run the suite, write
#                                              conformance/report.yaml and summary.txt (one
#                                              line per test), stop the node
#   scripts/conformance/gateway-conformance.sh build       the suite's test binary and its echo backend
#                                              (cached in ~/.cache/sluice/bin), and the echo
#                                              images under the names the suite's manifests use
#                                              (~/.cache/sluice/gateway-conformance/images)
#   scripts/conformance/gateway-conformance.sh up DIR      start a node in DIR, load the images, install
#                                              the Gateway API CRDs, Sluice (helm) and the
#                                              GatewayClass `sluice`
#   scripts/conformance/gateway-conformance.sh suite DIR [SUITE-FLAG...]
#                                              run the suite against the node in DIR (extra
#                                              flags go to the suite, e.g.
#                                              --run-test=HTTPRouteSimpleSameNamespace); the
#                                              report goes to $SLUICE_CONFORMANCE_REPORT
#                                              (default DIR/report.yaml)
#   scripts/conformance/gateway-conformance.sh reload DIR  rebuild Sluice's image from the current debug
#                                              binaries and `helm upgrade` to it
#   scripts/conformance/gateway-conformance.sh down DIR    stop the node and delete DIR
#   scripts/conformance/gateway-conformance.sh paths       prints SUITE=, ECHO=, IMAGES= for other scripts
#
# No registry: the images are packed from the locally built echo-basic binary with
# `testcluster.sh node-image`, tagged as registry.k8s.io/gateway-api/echo-basic:<tag> for
# every tag the suite's manifests name, and loaded into the real node's containerd
# (`testcluster.sh node-load`); the manifests set no pull policy and pin non-latest tags,
# so the kubelet uses the loaded image (IfNotPresent).
#
# Sluice runs from debug binaries ($CARGO_TARGET_DIR/debug) in a dev image, with the chart's
# default values plus the image reference: the dataplane Service's address (type
# LoadBalancer without a load balancer: its ClusterIP) is what Gateways publish, and the
# suite, on this host, reaches it through kube-proxy as an in-cluster client would. Each
# Gateway's Service is in the Gateway's namespace (controller.gatewayServices.placement=
# gateway), where GatewayInfrastructure's test looks for it: every request of the suite
# goes through those Services and the EndpointSlices the controller mirrors for them.
# Tests listed in conformance/skipped-tests.txt are skipped (each with its reason there).
# Needs root (the real node).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
MODDIR="$ROOT/scripts/conformance/gateway-conformance"
VERSION="$(cat "$ROOT/crds/gateway-api/VERSION")"
BIN="$SLUICE_CACHE/bin"
SUITE="$BIN/gateway-conformance-$VERSION.test"
ECHO="$BIN/gateway-echo-basic-$VERSION"
IMAGES="$SLUICE_CACHE/gateway-conformance/images-$VERSION"

TESTCLUSTER="$ROOT/scripts/cluster/testcluster.sh"
TARGET="${CARGO_TARGET_DIR:-$SLUICE_CACHE/target}"
REPO=example.invalid/sluice
NS=sluice
CLASS=sluice
SKIP_FILE="$ROOT/conformance/skipped-tests.txt"
# standard (default): the CRDs in crds/gateway-api/. experimental: the experimental channel's
# CRDs from the same module version, and the chart told so (HTTPRoute retry is claimed);
# `run` then writes conformance/experimental/.
CHANNEL="${SLUICE_CONFORMANCE_CHANNEL:-standard}"
case "$CHANNEL" in standard | experimental) ;; *) echo "SLUICE_CONFORMANCE_CHANNEL: standard or experimental" >&2; exit 2 ;; esac

log() { echo "==> gateway-conformance: $*" >&2; }
die() { echo "gateway-conformance: $*" >&2; exit 1; }

go_env() {
    env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" GOTOOLCHAIN=local \
        GOFLAGS="-trimpath -buildvcs=false -mod=readonly" CGO_ENABLED=0 "$@"
}

cmd_build() {
    command -v go >/dev/null || die "go is missing"
    grep -q "sigs.k8s.io/gateway-api/conformance $VERSION" "$MODDIR/go.mod" ||
        die "scripts/conformance/gateway-conformance/go.mod does not pin the conformance module at $VERSION"
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
        "$ROOT/scripts/cluster/testcluster.sh" node-image "$out" "$name" amd64 "$rootfs" /bin/echo-basic >/dev/null
        log "image $name -> $out"
    done < <(echo_tags)
    rm -rf "$rootfs"
}

kubectl_bin() { "$TESTCLUSTER" paths | sed -n 's/^KUBECTL=//p'; }
kube() { KUBECONFIG="$DIR/kubeconfig" "$(kubectl_bin)" "$@"; }
helm_() { KUBECONFIG="$DIR/kubeconfig" "$("$ROOT/scripts/install/helm.sh")" "$@"; }
sluice_version() { sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1; }

# Sluice's image from this checkout's debug binaries, loaded into the node as REPO:TAG.
load_sluice() {
    local tag=$1 out="$DIR/images"
    log "building Sluice's debug binaries ..."
    (cd "$ROOT" && CARGO_TARGET_DIR="$TARGET" cargo build -q -p sluice-controller -p sluice-dataplane)
    rm -rf "$out"
    bash "$ROOT/scripts/images/build-images.sh" --profile dev --arches amd64 \
        --amd64-bins "$TARGET/debug" --out "$out" >"$DIR/build-images.log" 2>&1 ||
        { tail -20 "$DIR/build-images.log" >&2; die "image build failed"; }
    "$TESTCLUSTER" node-load "$DIR" "$out/sluice-$(sluice_version).oci.tar" "$REPO:$tag" >/dev/null
    log "loaded $REPO:$tag"
}

load_echo() {
    local f base name
    for f in "$IMAGES"/*.oci.tar; do
        base="$(basename "$f" .oci.tar)"
        case "$base" in
        echo-basic-*) name="registry.k8s.io/gateway-api/echo-basic:${base#echo-basic-}" ;;
        echo-advanced-*) name="registry.k8s.io/gateway-api/echo-advanced:${base#echo-advanced-}" ;;
        *) continue ;;
        esac
        "$TESTCLUSTER" node-load "$DIR" "$f" "$name" >/dev/null
        log "loaded $name"
    done
    # The base manifests' CoreDNS (a UDP backend for UDPRoute tests, not run here, but the
    # suite waits for every pod of its namespaces): the node's own CoreDNS image under that
    # name. Its Corefile forwards to public resolvers, which the node's FORWARD rules refuse.
    local mod coredns
    mod="$(cd "$MODDIR" && go_env go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api/conformance)"
    coredns="$(grep -hoE 'image: *registry\.k8s\.io/coredns/coredns:[^ "]+' "$mod/base/manifests.yaml" | sed 's/^image: *//' | head -1)"
    f="$(ls "$SLUICE_CACHE"/testcluster/images/coredns-*.oci.tar | head -1)"
    [ -n "$coredns" ] && [ -n "$f" ] || die "no CoreDNS image for the base manifests"
    "$TESTCLUSTER" node-load "$DIR" "$f" "$coredns" >/dev/null
    log "loaded $coredns"
}

wait_release() {
    kube -n "$NS" rollout status deploy/sluice-controller --timeout=300s >/dev/null
    kube -n "$NS" rollout status deploy/sluice-dataplane --timeout=300s >/dev/null
}

cmd_up() {
    DIR=${1:?usage: $0 up DIR}
    cmd_build
    "$TESTCLUSTER" install --node >/dev/null
    "$ROOT/scripts/install/helm.sh" >/dev/null
    log "starting the node in $DIR ..."
    "$TESTCLUSTER" start "$DIR" --node ${SLUICE_OWNER_PID:+--owner-pid "$SLUICE_OWNER_PID"} >/dev/null
    load_echo
    local tag
    tag="$(sluice_version)-gw$(date +%s)"
    load_sluice "$tag"
    if [ "$CHANNEL" = experimental ]; then
        local api f
        api="$(cd "$MODDIR" && go_env go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)"
        for f in "$api"/config/crd/experimental/*.yaml; do
            [ "$(basename "$f")" = kustomization.yaml ] || kube apply --server-side -f "$f" >/dev/null
        done
    else
        kube apply --server-side -f "$ROOT/crds/gateway-api/" >/dev/null
    fi
    helm_ install sluice "$ROOT/charts/sluice" --namespace "$NS" --create-namespace \
        --set image.repository="$REPO" --set image.tag="$tag" --set image.pullPolicy=Never \
        --set controller.gatewayAPIChannel="$CHANNEL" \
        --set controller.gatewayServices.type=ClusterIP \
        --set controller.gatewayServices.placement=gateway >/dev/null
    printf '%s\n' "apiVersion: gateway.networking.k8s.io/v1" "kind: GatewayClass" \
        "metadata: {name: $CLASS}" "spec: {controllerName: sluice.dev/gateway-controller}" |
        kube apply -f - >/dev/null
    log "waiting for the release and the GatewayClass ..."
    wait_release
    kube wait --for=condition=Accepted "gatewayclass/$CLASS" --timeout=120s >/dev/null
    log "up: KUBECONFIG=$DIR/kubeconfig"
}

cmd_reload() {
    DIR=${1:?usage: $0 reload DIR}
    local tag
    tag="$(sluice_version)-gw$(date +%s)"
    load_sluice "$tag"
    helm_ upgrade sluice "$ROOT/charts/sluice" --namespace "$NS" --reuse-values \
        --set image.tag="$tag" >/dev/null
    wait_release
    log "reloaded: $REPO:$tag"
}

# The tests skipped, one per line with its reason after '#' (conformance/skipped-tests.txt).
skips() {
    [ -f "$SKIP_FILE" ] || return 0
    sed -e 's/#.*//' -e 's/[[:space:]]//g' "$SKIP_FILE" | { grep -v '^$' || true; } | paste -sd, -
}

cmd_suite() {
    DIR=${1:?usage: $0 suite DIR [SUITE-FLAG...]}
    shift
    local report="${SLUICE_CONFORMANCE_REPORT:-$DIR/report.yaml}" s
    local args=(
        --gateway-class="$CLASS"
        --conformance-profiles="${SLUICE_CONFORMANCE_PROFILES:-GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS,GATEWAY-TCP,GATEWAY-UDP}"
        --organization=sluice --project=sluice --url=https://github.com/sluice-proxy/sluice
        --version="v$(sluice_version)" --contact=@sluice-maintainers
        --report-output="$report"
        # GatewayStaticAddresses: a free address of the node's Service range becomes the
        # Gateway Service's clusterIP; one outside it is refused by the API server (never
        # routed: no packet is sent to either).
        --usable-address="${SLUICE_CONFORMANCE_USABLE_ADDRESS:-10.97.0.200}"
        --unusable-address="${SLUICE_CONFORMANCE_UNUSABLE_ADDRESS:-10.98.0.200}"
    )
    s="$(skips)"
    [ -z "$s" ] || args+=(--skip-tests="$s")
    rm -f "$report"
    log "running the suite (report: $report, log: $DIR/suite.log) ..."
    (cd "$DIR" && KUBECONFIG="$DIR/kubeconfig" "$SUITE" -test.v -test.timeout=100m \
        -test.run '^TestConformance$' "${args[@]}" "$@") >"$DIR/suite.log" 2>&1 || true
    # One line per test (not per subtest), and the totals.
    grep -E '^    --- (PASS|FAIL|SKIP)' "$DIR/suite.log" | sed -e 's/^ *//' -e 's/ (.*)$//' \
        -e 's|TestConformance/||' | sort -k2,2 -k3 >"$DIR/summary.txt" || true
    awk '{print $2}' "$DIR/summary.txt" | sort | uniq -c >&2
    grep -E '^--- (FAIL|PASS)' "$DIR/suite.log" >&2 || true
    [ -s "$report" ] || die "the suite wrote no report (see $DIR/suite.log)"
}

cmd_down() {
    DIR=${1:?usage: $0 down DIR}
    "$TESTCLUSTER" stop "$DIR" --remove
}

cmd_run() {
    RUN_DIR="$(mktemp -d /tmp/sluice-conformance.XXXXXX)"
    trap 'cmd_down "$RUN_DIR" || true' EXIT
    local dir=$RUN_DIR
    SLUICE_OWNER_PID=$$ cmd_up "$dir"
    local out="$ROOT/conformance"
    [ "$CHANNEL" = standard ] || out="$ROOT/conformance/$CHANNEL"
    mkdir -p "$out"
    SLUICE_CONFORMANCE_REPORT="$out/report.yaml" cmd_suite "$dir"
    cp "$dir/summary.txt" "$out/summary.txt"
    log "report: ${out#"$ROOT"/}/report.yaml"
}

case "${1:-}" in
build) cmd_build ;;
up) shift; cmd_up "$@" ;;
suite) shift; cmd_suite "$@" ;;
reload) shift; cmd_reload "$@" ;;
down) shift; cmd_down "$@" ;;
run) cmd_run ;;
paths)
    echo "SUITE=$SUITE"
    echo "ECHO=$ECHO"
    echo "IMAGES=$IMAGES"
    ;;
*)
    sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
