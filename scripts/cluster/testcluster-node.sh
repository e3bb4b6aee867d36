#!/usr/bin/env bash
# A real one-node Kubernetes cluster for tests: pods run in runc containers on this machine.
# Called by scripts/cluster/testcluster.sh (`install --node`, `start DIR --node`, `stop DIR`,
# `node-image`, `node-load`); see there for the loopback-only control plane the other e2e
# tests use.
#
#   install                   apt packages (containerd, runc, CNI plugins, iptables, conntrack,
#                             umoci, qemu-user-static, binfmt-support, busybox-static, buildah)
#                             and the pinned Go binaries: kubelet, kube-controller-manager,
#                             kube-scheduler, kube-proxy (scripts/cluster/testcluster/go.mod), CoreDNS,
#                             metrics-server; the pause binary (gcc -static). Cached.
#   start DIR [--owner-pid PID]
#                             etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
#                             containerd, kubelet, kube-proxy, CoreDNS, metrics-server; returns
#                             once the node is Ready and cluster DNS answers. DIR/kubeconfig,
#                             DIR/cluster.env (NODE=1 ...), DIR/logs/*.log.
#   stop DIR [--remove]       stops everything and undoes every change to the host
#   image OUT NAME ARCH ROOTFS ENTRYPOINT...
#                             packs ROOTFS into an OCI archive OUT holding image NAME (umoci)
#   load DIR ARCHIVE NAME [ARCH]
#                             imports an OCI archive's image into the node's containerd as NAME
#                             (with ARCH: that architecture's image of a multi-arch index)
#
# Requires root (bridge, iptables, mounts, cgroups). Only one node runs at a time on a host
# (fixed addresses below); `start` first tears down a node whose owner died.
#
# Addresses: bridge sluicenode0 = 10.88.0.1/16 is the node IP and the pod network; Services
# 10.97.0.0/16 (the loopback clusters use 10.96.0.0/16 and have no kube-proxy, so nothing
# collides); every component listens on 10.88.0.1 (nothing on loopback, which the other
# tests' random ports use). Guard rules make a stray packet impossible: nothing addressed to
# the pod or Service ranges leaves by another interface than the bridge, and pods reach
# nothing outside the bridge (mangle POSTROUTING drops, after kube-proxy's DNAT, so live
# Services work; filter rejects so clients fail fast). CoreDNS has no upstream forwarder.
set -euo pipefail

KUBE_VERSION=v1.34.4
COREDNS_VERSION=v1.14.7
METRICS_SERVER_VERSION=v0.9.0
NODE_NAME=sluice-node
BRIDGE=sluicenode0
NODE_IP=10.88.0.1
POD_CIDR=10.88.0.0/16
SERVICE_CIDR=10.97.0.0/16
API_SERVICE_IP=10.97.0.1
DNS_IP=10.97.0.10
GUARD=SLUICE-NODE-GUARD
# The one node on this host: the DIR of the running node.
OWNER_FILE=/run/sluice-testnode.dir

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/testcluster.sh"
MODDIR="$HERE/testcluster"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$SLUICE_CACHE/bin"
IMAGES="$SLUICE_CACHE/testcluster/images"

log() { echo "testcluster-node: $*" >&2; }
die() { log "error: $*"; exit 1; }

nodebin() { echo "$BIN/$1-$KUBE_VERSION"; }
coredns_bin() { echo "$BIN/coredns-$COREDNS_VERSION"; }
metrics_server_bin() { echo "$BIN/metrics-server-$METRICS_SERVER_VERSION"; }
pause_bin() { echo "$BIN/pause-1"; }

DEBS=(containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins
    iptables:iptables conntrack:conntrack umoci:umoci jq:jq
    qemu-aarch64-static:qemu-user-static update-binfmts:binfmt-support
    /bin/busybox:busybox-static buildah:buildah gcc:gcc /usr/lib/x86_64-linux-gnu/libc.a:libc6-dev)

have() { case $1 in /*) [ -e "$1" ] ;; *) command -v "$1" >/dev/null 2>&1 ;; esac; }

ensure_debs() {
    local need=() d
    for d in "${DEBS[@]}"; do have "${d%%:*}" || need+=("${d#*:}"); done
    [ ${#need[@]} -eq 0 ] && return
    log "installing Debian packages: ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
}

go_env() {
    env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" GOTOOLCHAIN=local \
        CGO_ENABLED=0 GOWORK=off "$@"
}

cmd_install() {
    [ "$(id -u)" -eq 0 ] || die "installing the node's packages needs root"
    ensure_debs
    mkdir -p "$BIN" "$IMAGES"
    exec 8>"$BIN/.install-node.lock"
    flock 8
    local t0=$SECONDS
    local cmds=(kubelet kube-controller-manager kube-scheduler kube-proxy) missing=() c
    for c in "${cmds[@]}"; do [ -x "$(nodebin "$c")" ] || missing+=("$c"); done
    if [ ${#missing[@]} -gt 0 ]; then
        local src="$SLUICE_CACHE/testcluster/src-node-$KUBE_VERSION" out="$BIN/.node-build.$$"
        mkdir -p "$src" "$out"
        cp "$MODDIR/go.mod" "$MODDIR/go.sum" "$src/"
        local v=${KUBE_VERSION#v} ldflags="-s -w" p pkgs=()
        for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=${v%%.*}"
            ldflags+=" -X $p.gitMinor=$(echo "$v" | cut -d. -f2) -X $p.gitTreeState=clean"
            ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
        done
        for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
        log "building ${missing[*]} $KUBE_VERSION ..."
        local t1=$SECONDS
        # NB: one `go build` of several packages compiles their shared packages once.
        (cd "$src" && go_env GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
            go build -ldflags "$ldflags" -o "$out/" "${pkgs[@]}")
        for c in "${missing[@]}"; do mv -f "$out/$c" "$(nodebin "$c")"; done
        rm -rf "$out"
        log "built ${missing[*]} in $((SECONDS - t1))s"
    fi
    local mod bin
    for mod in "github.com/coredns/coredns@$COREDNS_VERSION:$(coredns_bin)" \
        "sigs.k8s.io/metrics-server/cmd/metrics-server@$METRICS_SERVER_VERSION:$(metrics_server_bin)"; do
        bin=${mod#*:}
        mod=${mod%%:*}
        [ -x "$bin" ] && continue
        local gobin="$BIN/.gobin.$$"
        mkdir -p "$gobin"
        log "building $mod ..."
        local t1=$SECONDS
        # NB: these modules have no replace directives, so `go install mod@version` builds
        # them with their own go.sum, checked against the module proxy's checksum database.
        go_env GOFLAGS="-trimpath -buildvcs=false" GOBIN="$gobin" go install -ldflags "-s -w" "$mod"
        mv -f "$gobin"/* "$bin"
        rm -rf "$gobin"
        log "built $mod in $((SECONDS - t1))s"
    done
    if ! [ -x "$(pause_bin)" ]; then
        gcc -Os -static -s -o "$(pause_bin).tmp" -x c - <<'C'
/* The pod sandbox's pause process: sleeps, reaps zombies, exits 0 on SIGINT/SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void die(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction a = {0}, r = {0};
    a.sa_handler = die; sigaction(SIGINT, &a, 0); sigaction(SIGTERM, &a, 0);
    r.sa_handler = reap; r.sa_flags = SA_NOCLDSTOP; sigaction(SIGCHLD, &r, 0);
    for (;;) pause();
}
C
        mv -f "$(pause_bin).tmp" "$(pause_bin)"
    fi
    flock -u 8
    log "node binaries ready in $BIN ($((SECONDS - t0))s)"
}

# ---- images ----------------------------------------------------------------------------------

# image OUT NAME ARCH ROOTFS ENTRYPOINT...: an OCI archive holding ROOTFS as image NAME.
cmd_image() {
    local out=$1 name=$2 arch=$3 rootfs=$4
    shift 4
    local work
    work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-node-image.XXXXXX")
    umoci init --layout "$work/oci" >/dev/null
    umoci new --image "$work/oci:img" >/dev/null
    umoci unpack --rootless --image "$work/oci:img" "$work/b" >/dev/null 2>&1 ||
        umoci unpack --image "$work/oci:img" "$work/b" >/dev/null
    cp -a "$rootfs/." "$work/b/rootfs/"
    umoci repack --image "$work/oci:img" "$work/b" >/dev/null
    local args=() a
    for a in "$@"; do args+=(--config.entrypoint "$a"); done
    umoci config --image "$work/oci:img" --architecture "$arch" --os linux "${args[@]}" >/dev/null
    umoci gc --layout "$work/oci"
    jq --arg n "$name" '.manifests[0].annotations["io.containerd.image.name"]=$n' \
        "$work/oci/index.json" >"$work/index.json"
    mv "$work/index.json" "$work/oci/index.json"
    tar -C "$work/oci" -cf "$out.tmp" .
    mv -f "$out.tmp" "$out"
    rm -rf "$work"
}

# infra_images: the pause, CoreDNS and metrics-server images (cached by version).
infra_images() {
    mkdir -p "$IMAGES"
    local r
    r=$(mktemp -d "${TMPDIR:-/tmp}/sluice-node-rootfs.XXXXXX")
    if ! [ -e "$IMAGES/pause-1.oci.tar" ]; then
        mkdir -p "$r/pause"
        install -m 0755 "$(pause_bin)" "$r/pause/pause"
        cmd_image "$IMAGES/pause-1.oci.tar" example.invalid/pause:1 amd64 "$r/pause" /pause
    fi
    if ! [ -e "$IMAGES/coredns-$COREDNS_VERSION.oci.tar" ]; then
        mkdir -p "$r/coredns"
        install -m 0755 "$(coredns_bin)" "$r/coredns/coredns"
        cmd_image "$IMAGES/coredns-$COREDNS_VERSION.oci.tar" "example.invalid/coredns:$COREDNS_VERSION" \
            amd64 "$r/coredns" /coredns
    fi
    if ! [ -e "$IMAGES/metrics-server-$METRICS_SERVER_VERSION.oci.tar" ]; then
        mkdir -p "$r/ms/tmp"
        chmod 1777 "$r/ms/tmp"
        install -m 0755 "$(metrics_server_bin)" "$r/ms/metrics-server"
        cmd_image "$IMAGES/metrics-server-$METRICS_SERVER_VERSION.oci.tar" \
            "example.invalid/metrics-server:$METRICS_SERVER_VERSION" amd64 "$r/ms" /metrics-server
    fi
    rm -rf "$r"
}

ctr_() { ctr -a "$DIR/containerd/containerd.sock" -n k8s.io "$@"; }

# load DIR ARCHIVE NAME [ARCH]: imports the image of an OCI archive into the node's containerd
# as NAME; with ARCH, only that architecture's manifest of a multi-arch index (so an arm64
# image runs on this amd64 node under qemu). Prints the digest NAME points at and, for one
# image (not an index), its config digest: the image ID the kubelet reports.
cmd_load() {
    DIR=$(cd "$1" && pwd)
    local archive=$2 name=$3 arch=${4:-} work desc
    work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-node-load.XXXXXX")
    tar -C "$work" -xf "$archive"
    desc=$(jq -c '.manifests[0]' "$work/index.json")
    if [ -n "$arch" ]; then
        local media
        media=$(jq -r '.mediaType' <<<"$desc")
        case $media in
        application/vnd.oci.image.index.v1+json | application/vnd.docker.distribution.manifest.list.v2+json)
            local blob
            blob="$work/blobs/$(jq -r '.digest' <<<"$desc" | tr : /)"
            desc=$(jq -c --arg a "$arch" '[.manifests[] | select(.platform.architecture == $a)][0]' "$blob")
            [ "$desc" != null ] || die "$archive has no $arch image"
            # NB: without the platform field ctr imports and unpacks it on this amd64 host
            # (it filters foreign platforms out otherwise); the config still says arm64.
            desc=$(jq -c 'del(.platform)' <<<"$desc")
            ;;
        esac
    fi
    jq -n --argjson d "$desc" --arg n "$name" \
        '{schemaVersion: 2, manifests: [$d | .annotations = ((.annotations // {}) + {"io.containerd.image.name": $n})]}' \
        >"$work/index.json"
    tar -C "$work" -cf "$work.tar" .
    ctr_ images import "$work.tar" >/dev/null
    # The image ID the kubelet reports for a pod (the config digest), when NAME is one image.
    local config=
    case $(jq -r '.mediaType' <<<"$desc") in
    application/vnd.oci.image.manifest.v1+json | application/vnd.docker.distribution.manifest.v2+json)
        config=$(jq -r '.config.digest' "$work/blobs/$(jq -r '.digest' <<<"$desc" | tr : /)")
        ;;
    esac
    rm -rf "$work" "$work.tar"
    echo "$(jq -r '.digest' <<<"$desc") $config"
}

# ---- PKI -------------------------------------------------------------------------------------

gen_pki() {
    local pki=$DIR/pki kc=$DIR/kubeconfigs
    mkdir -p "$pki" "$kc"
    (
        cd "$pki"
        umask 077
        ossl() { openssl "$@" 2>/dev/null; }
        mkca() {
            ossl ecparam -name prime256v1 -genkey -noout -out "$1.key"
            ossl req -x509 -new -key "$1.key" -sha256 -days 30 -subj "/CN=$2" \
                -addext "basicConstraints=critical,CA:TRUE" \
                -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$1.crt"
        }
        issue() { # issue CA NAME SUBJECT EKU [SAN]
            ossl ecparam -name prime256v1 -genkey -noout -out "$2.key"
            ossl req -new -key "$2.key" -subj "$3" -out "$2.csr"
            {
                echo "basicConstraints=CA:FALSE"
                echo "keyUsage=critical,digitalSignature,keyEncipherment"
                echo "extendedKeyUsage=$4"
                [ -z "${5:-}" ] || echo "subjectAltName=$5"
            } >"$2.ext"
            ossl x509 -req -in "$2.csr" -CA "$1.crt" -CAkey "$1.key" -CAcreateserial -sha256 \
                -days 30 -extfile "$2.ext" -out "$2.crt"
            rm -f "$2.csr" "$2.ext"
        }
        mkca ca sluice-node-ca
        mkca front-proxy-ca sluice-node-front-proxy-ca
        issue ca apiserver "/CN=kube-apiserver" serverAuth \
            "IP:$NODE_IP,IP:$API_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
        issue ca admin "/O=system:masters/CN=sluice-admin" clientAuth
        issue ca apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
        issue ca kube-controller-manager "/CN=system:kube-controller-manager" clientAuth
        issue ca kube-scheduler "/CN=system:kube-scheduler" clientAuth
        issue ca kube-proxy "/CN=system:kube-proxy" clientAuth
        issue ca kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
        issue ca kubelet-serving "/CN=$NODE_NAME" serverAuth "IP:$NODE_IP,DNS:$NODE_NAME"
        issue front-proxy-ca front-proxy-client "/CN=front-proxy-client" clientAuth
        ossl ecparam -name prime256v1 -genkey -noout -out sa.key
        ossl ec -in sa.key -pubout -out sa.pub
        chmod 644 ./*.crt sa.pub
    )
    local u
    for u in admin kube-controller-manager kube-scheduler kube-proxy kubelet; do
        (
            umask 077
            cat >"$kc/$u.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sluice-node
  cluster: {server: "https://$NODE_IP:6443", certificate-authority-data: $(base64 -w0 <"$pki/ca.crt")}
users:
- name: $u
  user: {client-certificate-data: $(base64 -w0 <"$pki/$u.crt"), client-key-data: $(base64 -w0 <"$pki/$u.key")}
contexts:
- name: sluice-node
  context: {cluster: sluice-node, user: $u, namespace: default}
current-context: sluice-node
EOF
        )
    done
    cp "$kc/admin.kubeconfig" "$DIR/kubeconfig"
}

# ---- configuration files ---------------------------------------------------------------------

write_configs() {
    mkdir -p "$DIR/containerd" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/conf" "$DIR/kubelet" \
        "$DIR/pod-logs" "$DIR/manifests"
    cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$DIR/containerd/containerd.sock"
[ttrpc]
  address = "$DIR/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
  level = "warn"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$DIR/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "example.invalid/pause:1"
  stream_server_address = "$NODE_IP"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  # NB: the CRI gives sandboxes oom_score_adj -998; lowering it needs CAP_SYS_RESOURCE,
  # which containers (and this CI machine) may lack: clamp to containerd's own value.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$(command -v runc)"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
EOF
    cat >"$DIR/cni/net.d/10-sluice-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "sluice-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
    cat >"$DIR/conf/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
containerRuntimeEndpoint: unix://$DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
makeIPTablesUtilChains: false
tlsCertFile: $DIR/pki/kubelet-serving.crt
tlsPrivateKeyFile: $DIR/pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $DIR/pki/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $DIR/conf/resolv.conf
podLogsDir: $DIR/pod-logs
volumePluginDir: $DIR/kubelet/volume-plugins
# Imported images cannot be pulled again: never garbage-collect them. A CI disk may be
# nearly full: no eviction for disk (the signals left out are off), only for memory.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
evictionPressureTransitionPeriod: 10s
serializeImagePulls: false
EOF
    # Pods with dnsPolicy Default get this: no nameserver outside the cluster.
    echo "nameserver $DNS_IP" >"$DIR/conf/resolv.conf"
    cat >"$DIR/conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $DIR/kubeconfigs/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: $NODE_IP:10256
metricsBindAddress: $NODE_IP:10249
clusterCIDR: $POD_CIDR
nodePortAddresses: ["$NODE_IP/32"]
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# ---- host changes, each undone by `stop` -----------------------------------------------------

SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward
    net/bridge/bridge-nf-call-iptables net/bridge/bridge-nf-call-ip6tables
    net/ipv4/conf/all/route_localnet)

guard_rules() { # guard_rules -A|-D: the rules that keep every packet on this machine
    local op=$1
    # mangle POSTROUTING runs after every DNAT (kube-proxy's Services) and after routing. What
    # leaves by loopback or the bridge stays here; anything else addressed to a Service IP
    # (no endpoint) or to the pod network, or sent from a pod or the node address, is dropped.
    iptables -t mangle "$op" "$GUARD" -o lo -j RETURN
    iptables -t mangle "$op" "$GUARD" -o "$BRIDGE" -j RETURN
    iptables -t mangle "$op" "$GUARD" -d "$SERVICE_CIDR" -j DROP
    iptables -t mangle "$op" "$GUARD" -d "$POD_CIDR" -j DROP
    iptables -t mangle "$op" "$GUARD" -s "$POD_CIDR" -j DROP
    # The same as rejects where a client can be told at once (filter OUTPUT and FORWARD).
    iptables -t filter "$op" "$GUARD" -d "$SERVICE_CIDR" -j REJECT
    iptables -t filter "$op" "$GUARD" -i "$BRIDGE" ! -o "$BRIDGE" -j REJECT
    ip6tables -t filter "$op" "$GUARD" -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
}

guard_install() {
    iptables -t mangle -N "$GUARD" 2>/dev/null || iptables -t mangle -F "$GUARD"
    iptables -t filter -N "$GUARD" 2>/dev/null || iptables -t filter -F "$GUARD"
    ip6tables -t filter -N "$GUARD" 2>/dev/null || ip6tables -t filter -F "$GUARD"
    guard_rules -A
    iptables -t mangle -C POSTROUTING -j "$GUARD" 2>/dev/null || iptables -t mangle -I POSTROUTING -j "$GUARD"
    iptables -t filter -C OUTPUT -j "$GUARD" 2>/dev/null || iptables -t filter -I OUTPUT -j "$GUARD"
    iptables -t filter -C FORWARD -j "$GUARD" 2>/dev/null || iptables -t filter -I FORWARD -j "$GUARD"
    ip6tables -t filter -C FORWARD -j "$GUARD" 2>/dev/null || ip6tables -t filter -I FORWARD -j "$GUARD"
}

guard_remove() {
    while iptables -t mangle -D POSTROUTING -j "$GUARD" 2>/dev/null; do :; done
    while iptables -t filter -D OUTPUT -j "$GUARD" 2>/dev/null; do :; done
    while iptables -t filter -D FORWARD -j "$GUARD" 2>/dev/null; do :; done
    while ip6tables -t filter -D FORWARD -j "$GUARD" 2>/dev/null; do :; done
    iptables -t mangle -F "$GUARD" 2>/dev/null && iptables -t mangle -X "$GUARD"
    iptables -t filter -F "$GUARD" 2>/dev/null && iptables -t filter -X "$GUARD"
    ip6tables -t filter -F "$GUARD" 2>/dev/null && ip6tables -t filter -X "$GUARD"
    return 0
}

host_setup() {
    local k
    for k in "${SYSCTLS[@]}"; do
        [ -e "/proc/sys/$k" ] && echo "$k=$(cat "/proc/sys/$k")"
    done >"$DIR/sysctl.orig"
    [ -d /run/containerd ] && echo existed >"$DIR/run-containerd.orig"
    if command -v nft >/dev/null 2>&1; then nft list tables >"$DIR/nft-tables.orig" 2>/dev/null || true; fi
    guard_install
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr show dev "$BRIDGE" | grep -q "inet $NODE_IP/16" || ip addr add "$NODE_IP/16" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
    # arm64 images run under qemu-user-static (binfmt_misc, flag F so it works in containers)
    if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        echo mounted >"$DIR/binfmt.orig"
    fi
    if ! [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 ||
            update-binfmts --import qemu-aarch64 >/dev/null 2>&1 || true
        [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && echo registered >>"$DIR/binfmt.orig"
    fi
}

host_restore() {
    local k v
    if [ -e "$DIR/sysctl.orig" ]; then
        while IFS== read -r k v; do echo "$v" >"/proc/sys/$k" 2>/dev/null || true; done <"$DIR/sysctl.orig"
        rm -f "$DIR/sysctl.orig"
    fi
    if [ -e "$DIR/binfmt.orig" ]; then
        if grep -q registered "$DIR/binfmt.orig" && [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
            echo -1 >/proc/sys/fs/binfmt_misc/qemu-aarch64 || true
        fi
        if grep -q mounted "$DIR/binfmt.orig"; then umount /proc/sys/fs/binfmt_misc 2>/dev/null || true; fi
        rm -f "$DIR/binfmt.orig"
    fi
}

# ---- processes -------------------------------------------------------------------------------

pid_is() {
    local pid=$1 name=$2
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"
}

spawn() { # spawn NAME CMD...: detached, pid in DIR/run/NAME.pid, output in DIR/logs/NAME.log
    local name=$1
    shift
    setsid "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}

stop_one() { # stop_one NAME: TERM, up to 10 s, KILL
    local f=$DIR/run/$1.pid pid
    [ -e "$f" ] || return 0
    pid=$(cat "$f")
    if pid_is "$pid" "$1"; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do pid_is "$pid" "$1" || break; sleep 0.1; done
        pid_is "$pid" "$1" && kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$f"
}

wait_for() { # wait_for SECONDS WHAT CMD...
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    while ! "$@" >/dev/null 2>&1; do
        [ $((SECONDS - t0)) -lt "$limit" ] || { log "$what not ready after ${limit}s"; return 1; }
        sleep 0.2
    done
}

kc() { "$KUBECTL" --kubeconfig "$DIR/kubeconfig" "$@"; }

api_ready() {
    [ "$(curl -s --max-time 2 --cacert "$DIR/pki/ca.crt" --cert "$DIR/pki/admin.crt" \
        --key "$DIR/pki/admin.key" "https://$NODE_IP:6443/readyz")" = ok ]
}

node_ready() {
    [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

dns_ready() {
    [ "$(kc -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}')" = 1 ]
}

start_components() {
    local SB=$BIN P=$DIR/pki KC=$DIR/kubeconfigs
    spawn containerd nice -n 5 containerd --config "$DIR/containerd/config.toml"
    wait_for 30 containerd ctr_ version
    local img
    for img in "$IMAGES"/pause-1.oci.tar "$IMAGES/coredns-$COREDNS_VERSION.oci.tar" \
        "$IMAGES/metrics-server-$METRICS_SERVER_VERSION.oci.tar"; do
        ctr_ images import "$img" >/dev/null
    done
    spawn etcd "$SB/etcd-v3.6.4" --name sluice-node --data-dir "$DIR/etcd" \
        --listen-client-urls "http://$NODE_IP:2379" --advertise-client-urls "http://$NODE_IP:2379" \
        --listen-peer-urls "http://$NODE_IP:2380" --initial-advertise-peer-urls "http://$NODE_IP:2380" \
        --initial-cluster "sluice-node=http://$NODE_IP:2380" --unsafe-no-fsync --log-level warn
    wait_for 30 etcd sh -c "curl -s --max-time 1 http://$NODE_IP:2379/health | grep -q '\"health\":\"true\"'"
    spawn kube-apiserver "$SB/kube-apiserver-$KUBE_VERSION" \
        --etcd-servers "http://$NODE_IP:2379" \
        --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
        --tls-cert-file "$P/apiserver.crt" --tls-private-key-file "$P/apiserver.key" \
        --client-ca-file "$P/ca.crt" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --allow-privileged=true \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$P/sa.pub" --service-account-signing-key-file "$P/sa.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --kubelet-client-certificate "$P/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$P/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$P/ca.crt" --kubelet-preferred-address-types InternalIP \
        --requestheader-client-ca-file "$P/front-proxy-ca.crt" \
        --requestheader-allowed-names front-proxy-client \
        --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
        --requestheader-extra-headers-prefix X-Remote-Extra- \
        --proxy-client-cert-file "$P/front-proxy-client.crt" \
        --proxy-client-key-file "$P/front-proxy-client.key" \
        --enable-aggregator-routing=true --profiling=false
    wait_for 90 kube-apiserver api_ready
    spawn kube-controller-manager "$(nodebin kube-controller-manager)" \
        --kubeconfig "$KC/kube-controller-manager.kubeconfig" \
        --authentication-kubeconfig "$KC/kube-controller-manager.kubeconfig" \
        --authorization-kubeconfig "$KC/kube-controller-manager.kubeconfig" \
        --bind-address "$NODE_IP" --secure-port 10257 --leader-elect=false \
        --controllers '*' --use-service-account-credentials=true \
        --service-account-private-key-file "$P/sa.key" --root-ca-file "$P/ca.crt" \
        --cluster-signing-cert-file "$P/ca.crt" --cluster-signing-key-file "$P/ca.key" \
        --service-cluster-ip-range "$SERVICE_CIDR" --allocate-node-cidrs=false \
        --horizontal-pod-autoscaler-sync-period 5s \
        --flex-volume-plugin-dir "$DIR/kubelet/volume-plugins" --profiling=false
    spawn kube-scheduler "$(nodebin kube-scheduler)" \
        --kubeconfig "$KC/kube-scheduler.kubeconfig" \
        --authentication-kubeconfig "$KC/kube-scheduler.kubeconfig" \
        --authorization-kubeconfig "$KC/kube-scheduler.kubeconfig" \
        --bind-address "$NODE_IP" --secure-port 10259 --leader-elect=false --profiling=false
    spawn kubelet "$(nodebin kubelet)" --config "$DIR/conf/kubelet.yaml" \
        --kubeconfig "$KC/kubelet.kubeconfig" --root-dir "$DIR/kubelet" \
        --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v=1
    spawn kube-proxy "$(nodebin kube-proxy)" --config "$DIR/conf/kube-proxy.yaml"
}

cluster_addons() {
    cat >"$DIR/manifests/addons.yaml" <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  # No forward plugin: names outside the cluster get SERVFAIL, nothing leaves the node.
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 5
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: example.invalid/coredns:$COREDNS_VERSION
        imagePullPolicy: Never
        args: ["-conf", "/etc/coredns/Corefile"]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 2
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $DNS_IP
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: metrics-server, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:metrics-server"}
rules:
- apiGroups: [""]
  resources: [nodes/metrics]
  verbs: [get]
- apiGroups: [""]
  resources: [pods, nodes]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:metrics-server"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:metrics-server"}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "metrics-server:system:auth-delegator"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:auth-delegator"}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: metrics-server-auth-reader, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: extension-apiserver-authentication-reader}
subjects: [{kind: ServiceAccount, name: metrics-server, namespace: kube-system}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: metrics-server, namespace: kube-system, labels: {k8s-app: metrics-server}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: metrics-server}}
  template:
    metadata: {labels: {k8s-app: metrics-server}}
    spec:
      serviceAccountName: metrics-server
      containers:
      - name: metrics-server
        image: example.invalid/metrics-server:$METRICS_SERVER_VERSION
        imagePullPolicy: Never
        args:
        - --cert-dir=/tmp
        - --secure-port=4443
        - --kubelet-preferred-address-types=InternalIP
        - --kubelet-use-node-status-port
        - --metric-resolution=10s
        - --kubelet-request-timeout=5s
        - --kubelet-certificate-authority=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        ports: [{name: https, containerPort: 4443, protocol: TCP}]
        readinessProbe:
          httpGet: {path: /readyz, port: https, scheme: HTTPS}
          periodSeconds: 5
---
apiVersion: v1
kind: Service
metadata: {name: metrics-server, namespace: kube-system}
spec:
  selector: {k8s-app: metrics-server}
  ports: [{name: https, port: 443, targetPort: https, protocol: TCP}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  version: v1beta1
  groupPriorityMinimum: 100
  versionPriority: 100
  insecureSkipTLSVerify: true
  service: {name: metrics-server, namespace: kube-system}
EOF
    # NB: until the controller-manager made the namespace's default ServiceAccount, pods are refused.
    wait_for 60 "the kube-system ServiceAccount" kc -n kube-system get sa default
    kc apply -f "$DIR/manifests/addons.yaml" >/dev/null
}

# ---- start / stop ----------------------------------------------------------------------------

cmd_start() {
    DIR=${1:-}
    [ -n "$DIR" ] || die "usage: testcluster.sh start DIR --node [--owner-pid PID]"
    shift
    local owner=
    while [ $# -gt 0 ]; do
        case $1 in
        --owner-pid) owner=${2:?--owner-pid needs a pid}; shift 2 ;;
        *) die "unknown option $1" ;;
        esac
    done
    [ "$(id -u)" -eq 0 ] || die "a real node needs root (bridge, iptables, mounts, cgroups)"
    local c missing=
    for c in kubelet kube-controller-manager kube-scheduler kube-proxy kube-apiserver; do
        [ -x "$(nodebin "$c")" ] || missing+=" $c"
    done
    [ -x "$BIN/etcd-v3.6.4" ] || missing+=" etcd"
    [ -x "$(coredns_bin)" ] || missing+=" coredns"
    [ -x "$(metrics_server_bin)" ] || missing+=" metrics-server"
    [ -x "$(pause_bin)" ] || missing+=" pause"
    local d
    for d in "${DEBS[@]}"; do have "${d%%:*}" || missing+=" ${d#*:}"; done
    [ -z "$missing" ] || die "not installed:$missing; run: scripts/cluster/testcluster.sh install --node"
    KUBECTL=$("$SELF" paths | sed -n 's/^KUBECTL=//p')

    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    [ ! -e "$DIR/cluster.env" ] || die "$DIR already holds a cluster (stop it first)"
    # One node per host: tear down one whose owner died without stopping it.
    exec 7>/run/sluice-testnode.lock
    flock -w 600 7 || die "another node is starting or stopping"
    if [ -e "$OWNER_FILE" ]; then
        local old
        old=$(cat "$OWNER_FILE")
        if [ -e "$old/cluster.env" ] && pid_is "$(sed -n 's/^WATCHDOG_PID=//p' "$old/cluster.env")" watchdog; then
            die "a node is already running (state in $old); stop it with: scripts/cluster/testcluster.sh stop $old"
        fi
        log "cleaning up a node left behind by a dead owner ($old)"
        (teardown "$old") || true
    fi
    echo "$DIR" >"$OWNER_FILE"
    mkdir -p "$DIR/logs" "$DIR/run"
    local t0=$SECONDS
    {
        echo "NODE=1"
        echo "APISERVER_URL=https://$NODE_IP:6443"
        echo "CA_CERT=$DIR/pki/ca.crt"
        echo "SERVICE_CIDR=$SERVICE_CIDR"
        echo "POD_CIDR=$POD_CIDR"
        echo "NODE_IP=$NODE_IP"
        echo "NODE_NAME=$NODE_NAME"
        echo "CONTAINERD_SOCK=$DIR/containerd/containerd.sock"
        echo "KUBE_VERSION=$KUBE_VERSION"
    } >"$DIR/cluster.env.tmp"
    # NB: a separate bash, so that `set -e` stops at the first failing step (it is off
    # inside an `if` condition).
    if ! bash "${BASH_SOURCE[0]}" _up "$DIR"; then
        local l
        for l in "$DIR"/logs/*.log; do
            [ -e "$l" ] || continue
            log "$(basename "$l") (last lines):"
            tail -n 15 "$l" >&2 || true
        done
        [ -e "$DIR/cluster.env" ] || mv "$DIR/cluster.env.tmp" "$DIR/cluster.env" 2>/dev/null || true
        teardown "$DIR" || true
        die "the node in $DIR did not start"
    fi
    [ -z "$owner" ] || start_watchdog "$owner"
    flock -u 7
    log "node $NODE_NAME Ready in $((SECONDS - t0))s: https://$NODE_IP:6443 (kubeconfig: $DIR/kubeconfig)"
}

start_watchdog() {
    local owner=$1
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c '
        dir=$1 owner=$2 self=$3
        while kill -0 "$owner" 2>/dev/null; do
            [ -e "$dir/cluster.env" ] || exit 0
            sleep 0.5
        done
        [ -e "$dir/cluster.env" ] && "$self" stop "$dir" --remove >>"$dir.teardown.log" 2>&1
        rm -f "$dir.teardown.log"
    ' watchdog "$DIR" "$owner" "$SELF" </dev/null >/dev/null 2>&1 &
    echo "WATCHDOG_PID=$!" >>"$DIR/cluster.env"
}

# teardown DIR: every process, container, mount, rule, link, cgroup and setting of that node.
teardown() {
    DIR=$1
    # Every step runs whatever the previous ones did: a half-started node is torn down too.
    set +e +o pipefail
    case $DIR in
    /?*/*) ;;
    *) die "refusing to tear down a node in '$DIR' (not an absolute path two levels deep)" ;;
    esac
    local C="ctr -a $DIR/containerd/containerd.sock -n k8s.io"
    # The node is thrown away whole: no graceful pod deletion, the containers are killed.
    stop_one kube-proxy
    stop_one kubelet
    stop_one kube-scheduler
    stop_one kube-controller-manager
    stop_one kube-apiserver
    stop_one etcd
    if [ -e "$DIR/run/containerd.pid" ] && pid_is "$(cat "$DIR/run/containerd.pid")" containerd; then
        local t
        for t in $($C tasks ls -q 2>/dev/null); do $C tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true; done
        sleep 0.5
        for t in $($C tasks ls -q 2>/dev/null); do $C tasks delete -f "$t" >/dev/null 2>&1 || true; done
    fi
    stop_one containerd
    local pid
    for pid in $(pgrep -f "containerd-shim-runc-v2 -namespace k8s.io -address $DIR/containerd/containerd.sock" || true); do
        kill -KILL "$pid" 2>/dev/null || true
    done
    # Container processes the shims left (matched by their cgroup), then the kubepods cgroups.
    local cg
    for cg in $(find /sys/fs/cgroup -depth -type d -path '*/kubepods*' 2>/dev/null); do
        [ -e "$cg/cgroup.procs" ] && xargs -r kill -KILL <"$cg/cgroup.procs" 2>/dev/null || true
    done
    sleep 0.2
    find /sys/fs/cgroup -mindepth 2 -depth -type d -path '*/kubepods*' -exec rmdir {} \; 2>/dev/null || true
    # Mounts under DIR and the CRI's network namespace pins, deepest first.
    local m
    grep -E " ($DIR/|/run/netns/cni-|/run/containerd/)" /proc/mounts | awk '{print $2}' | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    rm -f /run/netns/cni-*
    # iptables: kube-proxy's chains (and KUBE-FIREWALL, which --cleanup leaves), then ours.
    [ -x "$(nodebin kube-proxy)" ] && "$(nodebin kube-proxy)" --cleanup >/dev/null 2>&1 || true
    local ipt tb ch c r
    for ipt in iptables ip6tables; do
        for tb in filter nat mangle; do
            for ch in INPUT OUTPUT FORWARD PREROUTING POSTROUTING; do
                $ipt -t $tb -S $ch 2>/dev/null | grep -E -- '-j KUBE-' | sed 's/^-A/-D/' |
                    while read -r r; do eval "$ipt -t $tb $r" || true; done
            done
            for c in $($ipt -t $tb -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -t $tb -F "$c" || true; done
            for c in $($ipt -t $tb -S 2>/dev/null | awk '/^-N KUBE-/{print $2}'); do $ipt -t $tb -X "$c" || true; done
        done
    done
    # Links: the bridge (veths went with their namespaces; any left are deleted first).
    local v
    for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
        ip link del "$v" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    # The guard goes last: until the bridge is gone, pod addresses must not leave.
    guard_remove
    # Tables kube-proxy and the guard created (iptables-nft makes them on first use), if empty.
    if [ -e "$DIR/nft-tables.orig" ]; then
        local tbl
        nft list tables 2>/dev/null | while read -r _ fam name; do
            grep -qx "table $fam $name" "$DIR/nft-tables.orig" && continue
            tbl=$(nft list table "$fam" "$name" 2>/dev/null)
            # no rule: only table/chain headers, base-chain types and braces
            echo "$tbl" | grep -vqE '^\s*(table |chain |type |\}|$)' ||
                nft delete table "$fam" "$name" 2>/dev/null
        done
        rm -f "$DIR/nft-tables.orig"
    fi
    conntrack -D -s "$POD_CIDR" >/dev/null 2>&1 || true
    conntrack -D -d "$SERVICE_CIDR" >/dev/null 2>&1 || true
    # State containerd 1.6, libcni and the kubelet keep at fixed paths.
    if [ -e "$DIR/run-containerd.orig" ]; then
        rm -rf /run/containerd/s /run/containerd/runc/k8s.io /run/containerd/io.containerd.runtime.v2.task/k8s.io
    else
        rm -rf /run/containerd
    fi
    rm -rf /var/lib/cni /var/log/containers /var/lib/kubelet /usr/libexec/kubernetes
    host_restore
    rm -f "$DIR/cluster.env" "$DIR/cluster.env.tmp"
    if [ -e "$OWNER_FILE" ] && [ "$(cat "$OWNER_FILE")" = "$DIR" ]; then rm -f "$OWNER_FILE"; fi
}

# _up DIR: the steps of `start` after its checks (set -e applies).
cmd_up() {
    DIR=$1
    KUBECTL=$("$SELF" paths | sed -n 's/^KUBECTL=//p')
    infra_images
    gen_pki
    write_configs
    host_setup
    start_components
    echo "APISERVER_PID=$(cat "$DIR/run/kube-apiserver.pid")" >>"$DIR/cluster.env.tmp"
    echo "ETCD_PID=$(cat "$DIR/run/etcd.pid")" >>"$DIR/cluster.env.tmp"
    mv "$DIR/cluster.env.tmp" "$DIR/cluster.env"
    wait_for 120 "node $NODE_NAME" node_ready
    cluster_addons
    wait_for 180 "cluster DNS (CoreDNS)" dns_ready
}

cmd_stop() {
    local dir=${1:-} remove=
    [ "${2:-}" = --remove ] && remove=1
    [ -d "$dir" ] || die "usage: testcluster.sh stop DIR [--remove] (no directory '$dir')"
    exec 7>/run/sluice-testnode.lock
    flock -w 600 7 || true
    teardown "$(cd "$dir" && pwd)"
    if [ -n "$remove" ]; then
        # NB: container root filesystems are unmounted above; what is left is plain files.
        rm -rf "$DIR" 2>/dev/null || { sleep 1; rm -rf "$DIR" || true; }
    fi
}

case ${1:-} in
install) cmd_install ;;
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "$@" ;;
_up) shift; cmd_up "$@" ;;
image) shift; cmd_image "$@" ;;
load) shift; cmd_load "$@" ;;
*) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
