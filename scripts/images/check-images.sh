#!/usr/bin/env bash
# Checks the multi-arch OCI archive that scripts/images/build-images.sh wrote: for linux/amd64 and
# linux/arm64 it takes that architecture's image out of the index (skopeo), unpacks it
# (umoci), and runs its binaries from the unpacked root filesystem only (chroot, as the
# image's user 65532; arm64 through qemu-aarch64-static copied into the unpacked tree):
# `--version` of both binaries, then the dataplane in standalone mode with a route to a real
# backend on 127.0.0.1, and one request proxied through it with curl.
#
#   scripts/images/check-images.sh [ARCHIVE]     default: dist/sluice-VERSION.oci.tar
#
# SLUICE_CHECK_ARCHES="amd64" checks only some architectures (default: amd64 arm64).
#
# Needs root (chroot), skopeo, umoci, qemu-user-static, curl and python3 (the backend).
set -euo pipefail
cd "$(dirname "$0")/../.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
archive=${1:-dist/sluice-$version.oci.tar}
[ -f "$archive" ] || { echo "check-images: $archive not found; build it with scripts/images/build-images.sh" >&2; exit 1; }
log() { echo "check-images: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (chroot into the unpacked images)"
tools="skopeo umoci curl python3"
case " ${SLUICE_CHECK_ARCHES:-amd64 arm64} " in *" arm64 "*) tools="$tools qemu-aarch64-static" ;; esac
for c in $tools; do
    command -v "$c" >/dev/null || fail "$c is missing (apt-get install skopeo umoci curl python3 qemu-user-static)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-check.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# A real backend on loopback that says who it is.
backend_port=$(free_port)
python3 - "$backend_port" >"$work/backend.log" 2>&1 <<'PY' &
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from the backend, path={self.path}, host={self.headers.get('Host')}\n".encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("x-backend", "check-images")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
pids+=($!)

ref="sluice:$version"
for arch in ${SLUICE_CHECK_ARCHES:-amd64 arm64}; do
    log "== linux/$arch"
    skopeo --override-arch "$arch" --override-os linux copy -q \
        "oci-archive:$archive:$ref" "oci:$work/layout-$arch:$arch"
    umoci unpack --image "$work/layout-$arch:$arch" "$work/bundle-$arch" >/dev/null
    rootfs="$work/bundle-$arch/rootfs"
    cfg=$(cat "$work/bundle-$arch/config.json")
    echo "$cfg" | python3 -c 'import json,sys; u=json.load(sys.stdin)["process"]["user"]; sys.exit(0 if u["uid"]==65532 and u["gid"]==65532 else 1)' ||
        fail "linux/$arch image does not run as 65532:65532"
    run=(chroot --userspec=65532:65532 "$rootfs")
    if [ "$arch" = arm64 ]; then
        file=$(od -An -tx1 -j18 -N2 "$rootfs/usr/local/bin/sluice-dataplane" | tr -d ' ')
        [ "$file" = b700 ] || fail "linux/arm64 sluice-dataplane is not an aarch64 ELF (e_machine $file)"
        # NB: the emulator runs inside the chroot, so the loader and libraries it maps are
        # the image's own.
        install -m 0755 "$(command -v qemu-aarch64-static)" "$rootfs/qemu-aarch64-static"
        run+=(/qemu-aarch64-static)
    fi
    for bin in sluice-controller sluice-dataplane; do
        v=$("${run[@]}" "/usr/local/bin/$bin" --version) || fail "linux/$arch $bin --version"
        [ "$v" = "$bin $version" ] || fail "linux/$arch $bin --version said: $v"
        log "linux/$arch: $v"
    done

    conf="$rootfs/tmp/standalone"
    mkdir -p "$conf"
    cat >"$conf/route.yaml" <<YAML
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: default}
spec:
  ports: [{name: http, port: 80, targetPort: $backend_port}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: backend-1
  namespace: default
  labels: {kubernetes.io/service-name: backend}
addressType: IPv4
endpoints: [{addresses: ["127.0.0.1"], conditions: {ready: true}}]
ports: [{name: http, port: $backend_port}]
---
apiVersion: apisix.apache.org/v2
kind: ApisixRoute
metadata: {name: check, namespace: default}
spec:
  http:
    - name: r1
      match: {hosts: [check.sluice.local], paths: ["/check/*"]}
      backends: [{serviceName: backend, servicePort: 80}]
YAML
    chmod -R a+rX "$conf"
    http=$(free_port)
    admin=$(free_port)
    "${run[@]}" /usr/local/bin/sluice-dataplane --standalone /tmp/standalone \
        --listen-http "127.0.0.1:$http" --listen-https "127.0.0.1:$(free_port)" \
        --admin "127.0.0.1:$admin" --workers 1 >"$work/dataplane-$arch.log" 2>&1 &
    dp=$!
    pids+=($dp)
    ready=
    for _ in $(seq 1 300); do
        if curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; then ready=1; break; fi
        kill -0 "$dp" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$ready" ] || { cat "$work/dataplane-$arch.log" >&2; fail "linux/$arch dataplane never became ready"; }
    resp=$(curl -sS -i --max-time 20 -H 'Host: check.sluice.local' "http://127.0.0.1:$http/check/$arch")
    echo "$resp" | sed 's/^/    /' >&2
    echo "$resp" | head -n1 | grep -q ' 200' || fail "linux/$arch: the proxied request did not answer 200"
    echo "$resp" | grep -qi '^x-backend: check-images' || fail "linux/$arch: the answer did not come from the backend"
    echo "$resp" | grep -q "path=/check/$arch" || fail "linux/$arch: the backend saw the wrong path"
    kill "$dp" 2>/dev/null || true
    wait "$dp" 2>/dev/null || true
    log "linux/$arch: OK (binaries run from the unpacked image; one request proxied by its dataplane)"
done
log "all images OK"
