#!/usr/bin/env bash
# A real, disposable Kubernetes control plane for tests: etcd + kube-apiserver on loopback.
#
#   scripts/cluster/testcluster.sh install             build/install the pinned binaries (idempotent)
#   scripts/cluster/testcluster.sh paths               print the installed binaries' paths
#   scripts/cluster/testcluster.sh start DIR [--owner-pid PID]
#                                              start etcd + kube-apiserver, write DIR/kubeconfig
#   scripts/cluster/testcluster.sh stop DIR [--remove] stop them (and delete DIR with --remove)
#
#   scripts/cluster/testcluster.sh install --node      also the real node's parts (root; see below)
#   scripts/cluster/testcluster.sh start DIR --node [--owner-pid PID]
#                                              a real one-node cluster: pods run in runc
#                                              containers (scripts/cluster/testcluster-node.sh)
#   scripts/cluster/testcluster.sh node-image OUT NAME ARCH ROOTFS ENTRYPOINT...
#                                              pack ROOTFS as image NAME (OCI archive OUT)
#   scripts/cluster/testcluster.sh node-load DIR ARCHIVE NAME [ARCH]
#                                              import an OCI archive's image into the node's
#                                              runtime as NAME (ARCH: one of a multi-arch index)
#
# Binaries are built from the Go module proxy (pinned in scripts/cluster/testcluster/go.mod and go.sum)
# into ${SLUICE_CACHE:-$HOME/.cache/sluice}/bin/NAME-VERSION with a NAME symlink; the Go module
# and build caches live under the same directory, so a second `install` takes a second.
#
# `start` generates a CA, a serving cert, an admin client cert (O=system:masters) and a
# service-account signing key pair with openssl, starts both processes detached on free
# loopback ports and returns once /readyz answers ok. DIR then holds:
#   kubeconfig      admin kubeconfig (certificates embedded)
#   cluster.env     KEY=VALUE lines: APISERVER_URL, ETCD_URL, ports, pids, CA/SA key paths
#   pki/            ca.crt ca.key sa.key sa.pub serving and admin certs
#   *.log           etcd and kube-apiserver logs
# With --owner-pid PID a watchdog stops the cluster and deletes DIR once PID exits (the Rust e2e
# harness passes its own pid, so nothing outlives a killed test binary).
#
# There is no kube-controller-manager: no namespace finalization (deleted namespaces stay
# Terminating), no default ServiceAccount per namespace, no Pods ever run.
set -euo pipefail

KUBE_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
SERVICE_CIDR=10.96.0.0/16

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$HERE/$(basename "${BASH_SOURCE[0]}")"
MODDIR="$HERE/testcluster"
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
BIN="$SLUICE_CACHE/bin"

log() { echo "testcluster: $*" >&2; }
die() { log "error: $*"; exit 1; }

apiserver_bin() { echo "${SLUICE_KUBE_APISERVER:-$BIN/kube-apiserver-$KUBE_VERSION}"; }
etcd_bin() { echo "${SLUICE_ETCD:-$BIN/etcd-$ETCD_VERSION}"; }

# The kubectl the tests use: SLUICE_KUBECTL, else one on PATH, else the one `install` built.
kubectl_bin() {
    if [ -n "${SLUICE_KUBECTL:-}" ]; then echo "$SLUICE_KUBECTL"
    elif command -v kubectl >/dev/null 2>&1; then command -v kubectl
    else echo "$BIN/kubectl-$KUBE_VERSION"; fi
}

sudo_cmd() { if [ "$(id -u)" -ne 0 ]; then echo sudo; fi; }

ensure_debs() {
    local need=()
    command -v openssl >/dev/null 2>&1 || need+=(openssl)
    command -v ip >/dev/null 2>&1 || need+=(iproute2)
    command -v ss >/dev/null 2>&1 || need+=(iproute2)
    command -v curl >/dev/null 2>&1 || need+=(curl)
    command -v flock >/dev/null 2>&1 || need+=(util-linux)
    if [ ${#need[@]} -gt 0 ]; then
        local sudo
        sudo=$(sudo_cmd)
        log "installing Debian packages: ${need[*]}"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
    fi
}

find_go() {
    local go
    go=$(command -v go 2>/dev/null || true)
    [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
    [ -n "$go" ] || die "no Go toolchain (need go >= 1.24 on PATH or in /usr/local/go) to build kube-apiserver"
    local v
    v=$(GOTOOLCHAIN=local "$go" env GOVERSION)
    v=${v#go}
    local major=${v%%.*} rest=${v#*.}
    local minor=${rest%%.*}
    if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 24 ]; }; then
        die "go $v is too old to build kube-apiserver $KUBE_VERSION (need >= 1.24)"
    fi
    echo "$go"
}

# Builds Go main packages from the pinned module into $BIN/NAME-VERSION.
#   go_build NAME VERSION PACKAGE
go_build() {
    local name=$1 version=$2 pkg=$3 go=$4
    local src="$SLUICE_CACHE/testcluster/src-$KUBE_VERSION"
    mkdir -p "$src" "$SLUICE_CACHE/go/mod" "$SLUICE_CACHE/go/build" "$BIN"
    # NB: the module directory must not contain the module cache, or `go` sees its files as
    # packages of this module.
    cp "$MODDIR/go.mod" "$MODDIR/go.sum" "$src/"
    local v=${KUBE_VERSION#v}
    local ldflags="-s -w"
    local p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=${v%%.*}"
        ldflags+=" -X $p.gitMinor=$(echo "$v" | cut -d. -f2) -X $p.gitTreeState=clean"
        ldflags+=" -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    local out="$BIN/.$name-$version.tmp.$$"
    log "building $name $version ($pkg) ..."
    local t0=$SECONDS
    (
        cd "$src"
        env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" \
            GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
            CGO_ENABLED=0 GOWORK=off \
            "$go" build -ldflags "$ldflags" -o "$out" "$pkg"
    )
    mv -f "$out" "$BIN/$name-$version"
    log "built $name $version in $((SECONDS - t0))s"
}

cmd_install() {
    ensure_debs
    grep -qE "^\s+k8s.io/kubernetes $KUBE_VERSION( |\$)" "$MODDIR/go.mod" ||
        die "KUBE_VERSION=$KUBE_VERSION does not match $MODDIR/go.mod"
    grep -qE "^\s+go.etcd.io/etcd/server/v3 $ETCD_VERSION( |\$)" "$MODDIR/go.mod" ||
        die "ETCD_VERSION=$ETCD_VERSION does not match $MODDIR/go.mod"
    mkdir -p "$BIN"
    local t0=$SECONDS
    exec 9>"$BIN/.install.lock"
    flock 9
    local want=(kube-apiserver etcd)
    # A kubectl is needed by the tests; build the matching one only when none is installed
    # (or when SLUICE_BUILD_KUBECTL=1 asks for it).
    if [ "${SLUICE_BUILD_KUBECTL:-}" = 1 ] ||
        { [ -z "${SLUICE_KUBECTL:-}" ] && ! command -v kubectl >/dev/null 2>&1; }; then
        want+=(kubectl)
    fi
    local name version pkg go=
    for name in "${want[@]}"; do
        case $name in
        kube-apiserver) version=$KUBE_VERSION pkg=k8s.io/kubernetes/cmd/kube-apiserver ;;
        kubectl) version=$KUBE_VERSION pkg=k8s.io/kubernetes/cmd/kubectl ;;
        etcd) version=$ETCD_VERSION pkg=go.etcd.io/etcd/server/v3 ;;
        esac
        # NB: builds land under their final name by `mv`, so an executable file is complete.
        if ! [ -x "$BIN/$name-$version" ]; then
            [ -n "$go" ] || go=$(find_go)
            go_build "$name" "$version" "$pkg" "$go"
        fi
        ln -sfn "$name-$version" "$BIN/$name"
    done
    flock -u 9
    log "kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION ready in $BIN ($((SECONDS - t0))s)"
    cmd_paths
}

cmd_paths() {
    echo "KUBE_APISERVER=$(apiserver_bin)"
    echo "ETCD=$(etcd_bin)"
    echo "KUBECTL=$(kubectl_bin)"
}

port_in_use() { [ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]; }

# free_port VAR: sets VAR to a free loopback port not handed out before in this run.
# (Not `$(free_port)`: a subshell would forget USED_PORTS.)
# NB: ports come from 10000-20999, below the kernel's ephemeral range (32768-60999 here),
# so no outgoing connection (curl, the API server's etcd clients, other tests) can be
# holding the port when etcd or the API server binds it; `ss -l` only sees listeners.
# e2e's free_port() takes 21000-32767 for the processes the tests start.
free_port() {
    local p lo=10000 hi=21000
    for _ in $(seq 1 200); do
        p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
        case " ${USED_PORTS:-} " in *" $p "*) continue ;; esac
        if ! port_in_use "$p"; then
            USED_PORTS="${USED_PORTS:-} $p"
            printf -v "$1" '%s' "$p"
            return
        fi
    done
    die "no free loopback port found"
}

gen_pki() {
    local pki=$1
    mkdir -p "$pki"
    (
        cd "$pki"
        umask 077
        local ossl="openssl"
        # EC P-256 keys: generated in milliseconds, accepted by every component.
        $ossl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
        $ossl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=sluice-test-ca" \
            -addext "basicConstraints=critical,CA:TRUE" \
            -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
            -out ca.crt 2>/dev/null
        # $1 name, $2 subject, $3 extensions
        issue() {
            $ossl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null
            $ossl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
            printf '%s\n' "$3" >"$1.ext"
            $ossl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
                -days 30 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
            rm -f "$1.csr" "$1.ext"
        }
        issue apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
        issue admin "/O=system:masters/CN=sluice-admin" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
        $ossl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
        $ossl ec -in sa.key -pubout -out sa.pub 2>/dev/null
        chmod 644 ca.crt apiserver.crt admin.crt sa.pub
    )
}

b64() { base64 -w0 <"$1"; }

write_kubeconfig() {
    local dir=$1 url=$2
    umask 077
    cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sluice-test
  cluster:
    server: $url
    certificate-authority-data: $(b64 "$dir/pki/ca.crt")
users:
- name: sluice-admin
  user:
    client-certificate-data: $(b64 "$dir/pki/admin.crt")
    client-key-data: $(b64 "$dir/pki/admin.key")
contexts:
- name: sluice-test
  context:
    cluster: sluice-test
    user: sluice-admin
    namespace: default
current-context: sluice-test
EOF
}

# Is PID alive and running program NAME? (Guards against killing a reused pid.)
pid_is() {
    local pid=$1 name=$2
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"
}

cmd_start() {
    local dir=${1:-} owner=
    [ -n "$dir" ] || die "usage: $0 start DIR [--owner-pid PID]"
    shift
    while [ $# -gt 0 ]; do
        case $1 in
        --owner-pid) owner=${2:?--owner-pid needs a pid}; shift 2 ;;
        *) die "unknown option $1" ;;
        esac
    done
    local apiserver etcd
    apiserver=$(apiserver_bin)
    etcd=$(etcd_bin)
    local missing=
    [ -x "$apiserver" ] || missing+=" kube-apiserver $KUBE_VERSION ($apiserver)"
    [ -x "$etcd" ] || missing+=" etcd $ETCD_VERSION ($etcd)"
    [ -z "$missing" ] || die "not installed:$missing; run: scripts/cluster/testcluster.sh install"
    command -v openssl >/dev/null 2>&1 || die "openssl is missing; run: scripts/cluster/testcluster.sh install"
    command -v curl >/dev/null 2>&1 || die "curl is missing; run: scripts/cluster/testcluster.sh install"

    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ ! -e "$dir/cluster.env" ] || die "$dir already holds a cluster (stop it first)"
    gen_pki "$dir/pki"

    local attempt
    for attempt in 1 2 3 4 5; do
        USED_PORTS=
        local etcd_port etcd_peer api_port
        free_port etcd_port
        free_port etcd_peer
        free_port api_port
        rm -rf "$dir/etcd-data"
        setsid "$etcd" --name sluice-test --data-dir "$dir/etcd-data" \
            --listen-client-urls "http://127.0.0.1:$etcd_port" \
            --advertise-client-urls "http://127.0.0.1:$etcd_port" \
            --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
            --initial-cluster "sluice-test=http://127.0.0.1:$etcd_peer" \
            --unsafe-no-fsync --log-level warn \
            </dev/null >"$dir/etcd.log" 2>&1 &
        local etcd_pid=$!
        # NB: the API server would retry, but starting it once etcd answers spares it a
        # round of connection back-off.
        for _ in $(seq 1 100); do
            kill -0 "$etcd_pid" 2>/dev/null || break
            curl -s --max-time 1 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"' && break
            sleep 0.05
        done
        setsid "$apiserver" \
            --etcd-servers "http://127.0.0.1:$etcd_port" \
            --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
            --endpoint-reconciler-type none \
            --tls-cert-file "$dir/pki/apiserver.crt" --tls-private-key-file "$dir/pki/apiserver.key" \
            --client-ca-file "$dir/pki/ca.crt" \
            --authorization-mode Node,RBAC \
            --service-account-issuer https://kubernetes.default.svc.cluster.local \
            --service-account-key-file "$dir/pki/sa.pub" \
            --service-account-signing-key-file "$dir/pki/sa.key" \
            --service-cluster-ip-range "$SERVICE_CIDR" \
            --profiling=false \
            </dev/null >"$dir/kube-apiserver.log" 2>&1 &
        local api_pid=$!
        {
            echo "APISERVER_URL=https://127.0.0.1:$api_port"
            echo "APISERVER_PORT=$api_port"
            echo "APISERVER_PID=$api_pid"
            echo "ETCD_URL=http://127.0.0.1:$etcd_port"
            echo "ETCD_PORT=$etcd_port"
            echo "ETCD_PID=$etcd_pid"
            echo "CA_CERT=$dir/pki/ca.crt"
            echo "CA_KEY=$dir/pki/ca.key"
            echo "SA_KEY=$dir/pki/sa.key"
            echo "SERVICE_CIDR=$SERVICE_CIDR"
            echo "KUBE_VERSION=$KUBE_VERSION"
            echo "ETCD_VERSION=$ETCD_VERSION"
        } >"$dir/cluster.env.tmp"
        mv "$dir/cluster.env.tmp" "$dir/cluster.env"
        write_kubeconfig "$dir" "https://127.0.0.1:$api_port"

        local t0=$SECONDS ready=
        while [ $((SECONDS - t0)) -lt 60 ]; do
            if ! kill -0 "$etcd_pid" 2>/dev/null || ! kill -0 "$api_pid" 2>/dev/null; then
                break
            fi
            if [ "$(curl -s --max-time 2 --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" \
                --key "$dir/pki/admin.key" "https://127.0.0.1:$api_port/readyz" 2>/dev/null)" = ok ]; then
                ready=1
                break
            fi
            sleep 0.1
        done
        if [ -n "$ready" ]; then
            if [ -n "$owner" ]; then
                start_watchdog "$dir" "$owner"
            fi
            log "ready: https://127.0.0.1:$api_port (kubeconfig: $dir/kubeconfig)"
            return 0
        fi
        local why="did not become ready within 60s"
        local taken
        taken=$(grep -hi "address already in use" "$dir/etcd.log" "$dir/kube-apiserver.log" 2>/dev/null | head -n 1 || true)
        if [ -n "$taken" ]; then
            why="port taken"
        fi
        cmd_stop "$dir" >/dev/null 2>&1 || true
        if [ "$why" != "port taken" ]; then
            log "etcd.log (last lines):"; tail -n 20 "$dir/etcd.log" >&2 || true
            log "kube-apiserver.log (last lines):"; tail -n 40 "$dir/kube-apiserver.log" >&2 || true
            die "the test cluster in $dir $why"
        fi
        log "attempt $attempt: a port was taken (etcd $etcd_port/$etcd_peer, apiserver $api_port), retrying with others: ${taken:0:300}"
    done
    die "could not start the test cluster in $dir (ports kept colliding)"
}

start_watchdog() {
    local dir=$1 owner=$2
    # Detached; exits when the cluster is stopped normally, cleans up when the owner dies.
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c '
        dir=$1 owner=$2 self=$3
        while kill -0 "$owner" 2>/dev/null; do
            [ -e "$dir/cluster.env" ] || exit 0
            sleep 0.5
        done
        [ -e "$dir/cluster.env" ] && "$self" stop "$dir" --remove
    ' watchdog "$dir" "$owner" "$SELF" </dev/null >/dev/null 2>&1 &
    echo "WATCHDOG_PID=$!" >>"$dir/cluster.env"
}

stop_pid() {
    local pid=$1 name=$2
    pid_is "$pid" "$name" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        pid_is "$pid" "$name" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    # NB: a killed process with many threads takes a moment to go; callers (and tests)
    # expect it gone when stop returns.
    for _ in $(seq 1 50); do
        pid_is "$pid" "$name" || return 0
        sleep 0.1
    done
}

cmd_stop() {
    local dir=${1:-} remove=
    [ -n "$dir" ] || die "usage: $0 stop DIR [--remove]"
    [ "${2:-}" = --remove ] && remove=1
    if [ -e "$dir/cluster.env" ]; then
        local APISERVER_PID ETCD_PID
        APISERVER_PID=$(sed -n 's/^APISERVER_PID=//p' "$dir/cluster.env")
        ETCD_PID=$(sed -n 's/^ETCD_PID=//p' "$dir/cluster.env")
        stop_pid "$APISERVER_PID" kube-apiserver
        stop_pid "$ETCD_PID" etcd
        rm -f "$dir/cluster.env"
    fi
    if [ -n "$remove" ]; then
        rm -rf "$dir"
    fi
}

NODE_SCRIPT="$HERE/testcluster-node.sh"
has_node_flag() { local a; for a in "$@"; do [ "$a" = --node ] && return 0; done; return 1; }
without_node_flag() { local a; for a in "$@"; do [ "$a" = --node ] || printf '%s\0' "$a"; done; }

case ${1:-} in
install)
    cmd_install
    if has_node_flag "$@"; then bash "$NODE_SCRIPT" install; fi
    ;;
paths) cmd_paths ;;
start)
    shift
    if has_node_flag "$@"; then
        mapfile -d '' args < <(without_node_flag "$@")
        exec bash "$NODE_SCRIPT" start "${args[@]}"
    fi
    cmd_start "$@"
    ;;
stop)
    shift
    if [ -n "${1:-}" ] && grep -qx 'NODE=1' "$1/cluster.env" 2>/dev/null; then
        exec bash "$NODE_SCRIPT" stop "$@"
    fi
    cmd_stop "$@"
    ;;
node-image) shift; exec bash "$NODE_SCRIPT" image "$@" ;;
node-load) shift; exec bash "$NODE_SCRIPT" load "$@" ;;
*)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
