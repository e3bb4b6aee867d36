#!/bin/sh
# Installs what the bench/ harness (sluice-bench) needs on Debian/Ubuntu:
#   nginx (nginx-light)  upstream origin and baseline proxy
#   haproxy              second baseline proxy (sluice-bench suite, issue 21)
#   libnginx-mod-stream  nginx's stream module (sluice-bench stream, issue 41)
#   wrk                  load generator
#   h2load (nghttp2-client) HTTPS keep-alive load (sluice-bench tls)
#   openssl              certificates for sluice-bench tls
#   taskset (util-linux) CPU pinning
#   kill (procps)        stopping process groups
#   getconf (libc-bin)   clock ticks per second
#   heaptrack            heap held per idle connection (bench/idle-heap.sh)
#   python3              bench/idle-heap.sh's client
#   h2load (nghttp2-client), curl   HTTP/2 and gRPC scenarios (bench/h2grpc.sh; Debian's
#                        nginx (bookworm: package nginx, pulled in by nginx-light) has the
#                        http_v2 and grpc modules that listen ... http2 and grpc_pass need)
# Idempotent: installs only what is missing, and runs `apt-get update` only
# when something has to be installed. Run as root (or via sudo).
set -eu

missing=""
on_path() { # like `command -v`, but ignores shell builtins such as kill
    IFS_SAVE=$IFS; IFS=:
    for dir in $PATH; do
        if [ -x "$dir/$1" ] && [ ! -d "$dir/$1" ]; then IFS=$IFS_SAVE; return 0; fi
    done
    IFS=$IFS_SAVE
    return 1
}

need() { # need COMMAND PACKAGE
    if ! on_path "$1"; then
        case " $missing " in
            *" $2 "*) ;;
            *) missing="$missing $2" ;;
        esac
    fi
}

need nginx nginx-light
need haproxy haproxy
need wrk wrk
need h2load nghttp2-client
need openssl openssl
need taskset util-linux
need kill procps
need getconf libc-bin
need curl curl
need heaptrack heaptrack
need heaptrack_print heaptrack
need python3 python3
# A module, not a command: nginx -V says --with-stream=dynamic.
[ -e /usr/lib/nginx/modules/ngx_stream_module.so ] || missing="$missing libnginx-mod-stream"

if [ -z "$missing" ]; then
    echo "install-bench-deps: nginx (with its stream module), haproxy, wrk, taskset, kill, getconf, h2load, curl, openssl, heaptrack and python3 are already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "install-bench-deps: need root to install:$missing" >&2
        exit 1
    fi
else
    SUDO=""
fi

echo "install-bench-deps: installing:$missing"
$SUDO apt-get update
# shellcheck disable=SC2086 # word splitting of the package list is intended
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $missing

# Debian's nginx package enables and starts a system-wide nginx on port 80.
# The harness starts its own instances; the system one is not needed.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet nginx 2>/dev/null; then
    echo "install-bench-deps: note: a system nginx service is running (not used by the harness)"
fi
# The same for haproxy (port 80/stats in Debian's default config is not used either).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet haproxy 2>/dev/null; then
    echo "install-bench-deps: note: a system haproxy service is running (not used by the harness)"
fi
echo "install-bench-deps: done"
