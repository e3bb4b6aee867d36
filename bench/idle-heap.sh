#!/usr/bin/env bash
# Where a parked idle keep-alive connection's memory goes (issue 21, idle scenario): heap
# profiles of sluice-dataplane holding N idle keep-alive connections (each has sent one
# `GET /hello` and then idles), taken with heaptrack after the connections parked, against
# the same dataplane holding none. The difference divided by N is the heap per parked
# connection, by allocation site.
#
#   bench/idle-heap.sh [--sluice-bin PATH] [--count N] [--out DIR]
#
# Method: an nginx origin on 127.0.0.1:1980 (as the suite's), the dataplane under
# `heaptrack` with bench/config/suite.yaml and the suite's flags (`--write-batching send`,
# one worker); this script opens N connections, sends one request on each, waits 5 s (the
# dataplane parks a connection after 2 s idle and trims its heap), reads VmRSS, then
# SIGKILLs the dataplane so that what it still held is heaptrack's "leaked" memory.
# Writes DIR/summary.md (RSS and heap, per connection) and the heaptrack_print outputs.
# The dataplane must use glibc's malloc, which heaptrack sees (mimalloc, the default global
# allocator, is invisible to it): build it with
#   cargo build --profile profiling -p sluice-dataplane --features system-allocator
# (the profiling profile keeps symbols, so the allocation sites have names). The heap
# profile is the same with either allocator; RSS is not (measure that with
# `sluice-bench conns`).
# Needs heaptrack, nginx and python3: scripts/install/bench-deps.sh installs what is missing
# (as root, or with sudo). Runs under
# `flock /tmp/sluice-bench.lock` so it never overlaps a benchmark.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
sluice_bin="${CARGO_TARGET_DIR:-$root/target}/profiling/sluice-dataplane"
count=5000
out="${SLUICE_CACHE:-$HOME/.cache/sluice}/bench/results/idle-heap-$(uname -m)-$(date -u +%Y%m%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
    case "$1" in
        --sluice-bin) sluice_bin="$2"; shift 2 ;;
        --count) count="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "usage: $0 [--sluice-bin PATH] [--count N] [--out DIR]" >&2; exit 2 ;;
    esac
done
for t in heaptrack heaptrack_print nginx python3; do
    command -v "$t" >/dev/null || { "$root/scripts/install/bench-deps.sh" >&2; break; }
done
[ -x "$sluice_bin" ] || { echo "no dataplane at $sluice_bin (cargo build --profile profiling -p sluice-dataplane --features system-allocator)" >&2; exit 1; }
if [ -z "${SLUICE_BENCH_LOCKED:-}" ]; then
    exec env SLUICE_BENCH_LOCKED=1 flock /tmp/sluice-bench.lock "$0" --sluice-bin "$sluice_bin" --count "$count" --out "$out"
fi
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; [ -n "${keep_work:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"

# The origin: nginx answering GET /hello on 127.0.0.1:1980.
cat > "$work/origin.conf" <<CONF
worker_processes 1;
master_process off;
daemon off;
pid $work/origin.pid;
error_log $work/origin.err warn;
events { worker_connections 1024; }
http {
    access_log off;
    server { listen 127.0.0.1:1980; location / { return 200 "hello world\n"; } }
}
CONF
nginx -c "$work/origin.conf" -p "$work" &
pids+=($!)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() { # run LABEL N
    local label=$1 n=$2 http admin
    http=$(free_port); admin=$(free_port)
    rm -f "$work"/heaptrack.*
    heaptrack -o "$work/heaptrack.$label" "$sluice_bin" --standalone "$root/bench/config/suite.yaml" \
        --listen-http "127.0.0.1:$http" --listen-https 127.0.0.1:0 --admin "127.0.0.1:$admin" \
        --workers 1 --write-batching=send --max-connections=$((n + 1024)) --header-timeout=300s \
        > "$work/$label.log" 2>&1 &
    local ht=$!
    pids+=("$ht")
    if python3 - "$http" "$n" "$label" "$out" "$work" <<'PY'
import os, socket, subprocess, sys, time
port, n, label, out, work = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
req = b"GET /hello HTTP/1.1\r\nHost: bench\r\n\r\n"
deadline = time.time() + 60
while True:  # the dataplane under heaptrack starts slowly
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5); s.sendall(req)
        if s.recv(4096).startswith(b"HTTP/1.1 200"): s.close(); break
    except OSError:
        pass
    if time.time() > deadline: sys.exit("dataplane not serving")
    time.sleep(0.2)
def pid_of():
    for p in os.listdir("/proc"):
        if not p.isdigit(): continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            if cmd and b"sluice-dataplane" in os.path.basename(cmd[0]) and f"127.0.0.1:{port}".encode() in cmd: return int(p)
        except OSError:
            pass
    sys.exit("dataplane pid not found")
pid = pid_of()
held = []
# NB: one at a time, as a client that connects, asks and then idles: the dataplane keeps
# one upstream connection, not one per client.
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30); s.sendall(req)
    got = b""
    while b"hello world" not in got:
        b = s.recv(4096)
        if not b: sys.exit(f"connection {i} closed before its answer: {got[:200]!r}")
        got += b
    held.append(s)
time.sleep(5)  # parked after 2 s, heap trimmed after that
rss = [l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]
open(f"{work}/{label}.rss", "w").write(rss)
os.kill(pid, 9)
PY
    then :; else
        # The client failed: end the dataplane so that heaptrack ends too.
        pkill -9 -f -- "--listen-http 127.0.0.1:$http" || true
        wait "$ht" || true
        keep_work=1
        echo "idle-heap: the $label run failed; see $work/$label.log" >&2
        return 1
    fi
    wait "$ht" || true
    heaptrack_print -f "$work"/heaptrack."$label".* --print-leaks --print-peaks=0 \
        --print-allocators=0 --print-temporary=0 --peak-limit 25 > "$out/$label-held.txt" 2>/dev/null || true
}
run none 0
run idle "$count"
r0=$(cat "$work/none.rss"); r1=$(cat "$work/idle.rss")
leak() { sed -n 's/^total memory leaked: \(.*\)$/\1/p' "$out/$1-held.txt"; }
{
    echo "# Heap held by parked idle connections ($(uname -m), $(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    echo "- dataplane: $sluice_bin (modified $(date -u -r "$sluice_bin" +%Y-%m-%dT%H:%MZ); this checkout: $(git -C "$root" rev-parse --short HEAD)), under heaptrack, one worker, --write-batching send"
    echo "- $count idle keep-alive connections, each after one GET /hello, 5 s after the last response"
    echo
    echo "| | no idle connections | $count idle | per connection |"
    echo "|---|---:|---:|---:|"
    echo "| VmRSS (KiB; heaptrack's own memory included) | $r0 | $r1 | $(( (r1 - r0) * 1024 / count )) B |"
    echo "| heap still held (heaptrack 'leaked' at SIGKILL) | $(leak none) | $(leak idle) | see idle-held.txt |"
    echo
    echo "Allocation sites of the heap held with the idle connections: \`idle-held.txt\`; without: \`none-held.txt\`."
} > "$out/summary.md"
cat "$out/summary.md"
