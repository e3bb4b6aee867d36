#!/usr/bin/env bash
# Checks the TLS path of an arm64 (aarch64) dataplane: cross-compiles sluice-dataplane for
# aarch64-unknown-linux-gnu (Debian's rustc-web + gcc-aarch64-linux-gnu, as
# scripts/images/build-images.sh does), runs it under qemu-aarch64-static in standalone mode with an
# HTTPS listener and real certificates made here with openssl (a CA, a leaf for
# tls.example.com, a default certificate), and sends requests through it to a loopback origin:
#
#   - curl --resolve tls.example.com over HTTP/2 (ALPN) and HTTP/1.1, verifying the chain
#     against the CA: 200 with the origin's body;
#   - openssl s_client with an unknown SNI and without SNI: the default certificate
#     (--default-ssl-certificate);
#   - the binary really is an aarch64 ELF (readelf).
#
#   scripts/images/check-arm64-tls.sh [--profile fast|release] [--bin PATH]
#
#   --bin uses an already built aarch64 sluice-dataplane instead of building one.
#
# Not part of scripts/test.sh (the cross build takes many minutes). Installs what it needs via
# apt. Builds into $SLUICE_CACHE/target-arm64-tls unless SLUICE_ARM64_TARGET_DIR says
# otherwise. Prints "check-arm64-tls: OK" and exits 0 when every check passed.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=fast
bin=
while [ $# -gt 0 ]; do
    case $1 in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --bin) bin=${2:?--bin needs a path}; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-arm64-tls: unknown option $1" >&2; exit 2 ;;
    esac
done
log() { echo "check-arm64-tls: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
target_dir=${SLUICE_ARM64_TARGET_DIR:-$SLUICE_CACHE/target-arm64-tls}

case $(uname -m) in
x86_64) ;;
*) log "this script cross-compiles on x86_64 hosts"; exit 1 ;;
esac

# ---- tools (idempotent) ------------------------------------------------------------------
need=()
for c in aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu qemu-aarch64-static:qemu-user-static \
    readelf:binutils openssl:openssl curl:curl python3:python3; do
    command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}")
done
if [ -z "$bin" ]; then
    [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ] || need+=(rustc-web cargo-web)
    [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || need+=(libstd-rust-web-dev:arm64)
fi
[ -d /usr/aarch64-linux-gnu/lib ] || need+=(libc6-dev-arm64-cross)
if [ ${#need[@]} -gt 0 ]; then
    sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
    log "installing Debian packages: ${need[*]}"
    dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---- the aarch64 binary ------------------------------------------------------------------
if [ -z "$bin" ]; then
    log "building sluice-dataplane for aarch64 (Debian rustc $(/usr/bin/rustc --version | cut -d' ' -f2), profile $profile) ..."
    t0=$SECONDS
    # NB: the rustup cargo and rustc come first on PATH; only Debian's toolchain has the
    # aarch64 standard library, so name it by full path.
    env -u RUSTUP_TOOLCHAIN RUSTC=/usr/bin/rustc CARGO_INCREMENTAL=0 \
        CARGO_TARGET_DIR="$target_dir" \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
        nice -n 10 /usr/bin/cargo build --locked --quiet --profile "$profile" \
        --target aarch64-unknown-linux-gnu -p sluice-dataplane --bin sluice-dataplane
    dir=$profile; [ "$profile" = dev ] && dir=debug
    bin="$target_dir/aarch64-unknown-linux-gnu/$dir/sluice-dataplane"
    log "built in $((SECONDS - t0))s: $bin"
fi
[ -x "$bin" ] || fail "no binary at $bin"
machine=$(readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
log "binary: $bin ($machine)"
[ "$machine" = "AArch64" ] || fail "$bin is not an aarch64 binary ($machine)"

# ---- certificates, origin, configuration -------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-arm64-tls.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
origin_port=$(free_port)
http_port=$(free_port)
https_port=$(free_port)
admin_port=$(free_port)

cd "$work"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=arm64 check CA" -keyout ca.key -out ca.pem 2>/dev/null
leaf() { # name cn san
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s\n' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
        -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
leaf tls tls.example.com tls.example.com
leaf fallback ingress.default ingress.default
secret() { # name cert key
    printf 'apiVersion: v1\nkind: Secret\nmetadata: {name: %s, namespace: default}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n' "$1"
    cat "$2" ca.pem | sed 's/^/    /'
    printf '  tls.key: |\n'
    sed 's/^/    /' "$3"
    printf -- '---\n'
}
mkdir conf www
echo "hello from the loopback origin" >www/hello.txt
{
    secret tls-cert tls.pem tls.key
    secret fallback-cert fallback.pem fallback.key
    cat <<EOF
apiVersion: v1
kind: Service
metadata: {name: origin, namespace: default}
spec:
  ports: [{name: http, port: 80, targetPort: $origin_port}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: origin-1
  namespace: default
  labels: {kubernetes.io/service-name: origin}
addressType: IPv4
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
ports: [{name: http, port: $origin_port}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: web, namespace: default}
spec:
  http:
    - name: all
      match: {paths: ["/*"]}
      backends: [{serviceName: origin, servicePort: http}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixTls
metadata: {name: tls, namespace: default}
spec:
  hosts: [tls.example.com]
  secret: {name: tls-cert, namespace: default}
EOF
} >conf/config.yaml

# The origin: HTTP/1.1 with keep-alive, as an upstream pool expects.
python3 - "$origin_port" >origin.log 2>&1 <<'PY' &
import http.server, sys
class Origin(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def __init__(self, *a, **kw):
        super().__init__(*a, directory="www", **kw)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Origin).serve_forever()
PY
pids+=($!)
for _ in $(seq 1 100); do
    curl -fsS --max-time 2 "http://127.0.0.1:$origin_port/hello.txt" >/dev/null 2>&1 && break
    sleep 0.1
done
# NB: the loader and libc come from Debian's multiarch libc6:arm64 (/lib/aarch64-linux-gnu,
# pulled in by libstd-rust-web-dev:arm64) when present: under qemu-user 7.2 on this kernel,
# the older cross libc in /usr/aarch64-linux-gnu never returns from pthread_create.
sysroot=/usr/aarch64-linux-gnu
[ -e /lib/ld-linux-aarch64.so.1 ] && [ -e /lib/aarch64-linux-gnu/libc.so.6 ] && sysroot=/
log "starting the aarch64 dataplane under qemu-aarch64-static (-L $sysroot) ..."
qemu-aarch64-static -L "$sysroot" "$bin" --standalone conf \
    --listen-http "127.0.0.1:$http_port" --listen-https "127.0.0.1:$https_port" \
    --admin "127.0.0.1:$admin_port" --workers 1 \
    --default-ssl-certificate default/fallback-cert >dataplane.log 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
    curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS --max-time 2 "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 || {
    cat dataplane.log >&2
    fail "the dataplane did not become ready"
}

# ---- checks ------------------------------------------------------------------------------
for proto in --http2 --http1.1; do
    out=$(curl -sS --max-time 20 "$proto" --cacert ca.pem --resolve "tls.example.com:$https_port:127.0.0.1" \
        -w '\n%{http_version} %{http_code} %{ssl_verify_result}' \
        "https://tls.example.com:$https_port/hello.txt") || {
        cat dataplane.log >&2
        fail "curl $proto https://tls.example.com:$https_port/hello.txt"
    }
    echo "curl $proto --resolve tls.example.com:$https_port:127.0.0.1 https://tls.example.com:$https_port/hello.txt"
    echo "$out" | sed 's/^/    /'
    last=$(echo "$out" | tail -n1)
    want="2 200 0"; [ "$proto" = --http1.1 ] && want="1.1 200 0"
    [ "$last" = "$want" ] || fail "expected '$want' (HTTP version, status, verify result), got '$last'"
    echo "$out" | grep -qx "hello from the loopback origin" || fail "origin body missing"
done
for args in "-servername unknown.test" "-noservername" "-servername tls.example.com"; do
    # shellcheck disable=SC2086
    subject=$(timeout 20 openssl s_client -connect "127.0.0.1:$https_port" $args -CAfile ca.pem </dev/null 2>/dev/null |
        sed -n 's/^subject=//p')
    echo "openssl s_client $args: subject=$subject"
    case $args in
    *tls.example.com) [ "$subject" = "CN = tls.example.com" ] || fail "$args: got subject '$subject'" ;;
    *) [ "$subject" = "CN = ingress.default" ] || fail "$args: expected the default certificate, got '$subject'" ;;
    esac
done
snapshot=$(curl -fsS --max-time 5 "http://127.0.0.1:$admin_port/snapshot")
echo "admin /snapshot: $snapshot"
log "OK: aarch64 sluice-dataplane ($machine, under qemu-aarch64-static) terminated TLS (h2 and http/1.1, SNI, default certificate) and proxied to the loopback origin"
