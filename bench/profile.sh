#!/usr/bin/env bash
# Deterministic per-request cost of the proxy path (issues 2 and 4): user-space
# instructions per request (valgrind callgrind) and system calls per request (perf
# tracepoints), for sluice-dataplane and, side by side, for the nginx baseline.
#
#   bench/profile.sh [--sluice-bin PATH] [--only sluice|nginx] [--scenario 1|2]
#                    [--n1 N] [--n2 N] [--conns C] [--out DIR] [--no-callgrind]
#                    [--no-syscalls] [--churn] [--write-batching auto|send|off]
#
# --write-batching is passed to sluice-dataplane (default: its own, `auto`, which takes
# io_uring where the kernel allows it, under valgrind too); `send` is the mode pods run in
# (their seccomp profile refuses io_uring). Both figures are of the mode asked for.
#
# --churn sends every request on a new connection (`Connection: close`; h2load opens the
# next one), so the figures are per connection: accept, head, proxying, close.
#
# --scenario 2 runs sluice with bench/config/scenario2.yaml (limit-count + prometheus on
# the route); nginx always runs the plain proxy (nginx has no such plugins).
#
# Method (the same for both proxies, same origin as `sluice-bench proxy --scenario 1`:
# nginx answering `200 hello world\n` on 127.0.0.1:1980):
#   * instructions: the proxy runs under `valgrind --tool=callgrind` (all threads). h2load
#     sends exactly N keep-alive HTTP/1.1 requests for GET /hello over C connections; the
#     proxy is stopped and callgrind's total Ir read. This is done for N1 and N2 requests;
#     (Ir(N2) - Ir(N1)) / (N2 - N1) removes start-up, config loading and shutdown.
#   * system calls: the proxy runs natively (proxy + origin on CPU 0, h2load on CPU 1, as in
#     sluice-bench); after a warm-up, `perf stat -e 'syscalls:sys_enter_*' -p PID` counts
#     while h2load sends N1 and then N2 requests; the difference / (N2 - N1) per syscall.
#     Under load several requests are ready per epoll_wait, so the figure depends on C a
#     little (epoll_wait per request); the others are per request whatever the load.
# Writes DIR/summary.md and, per proxy, the callgrind files of the N2 run and their
# `callgrind_annotate --inclusive=yes` output (look there for where the cost goes), and
# for sluice a table of its instructions by where the code comes from (sluice's own crates,
# hyper, http, httparse, tokio, the allocator, libc's memcpy; std code inlined into a
# function counts for that function's crate). That table is of the whole N2 run (start-up
# included) divided by N2, so it sums to a little more than the per-request figure.
#
# Needs: valgrind, h2load (nghttp2-client), nginx, perf (linux-perf), taskset, curl. The
# script installs the Debian packages that are missing (`apt-get install valgrind
# nghttp2-client nginx-light linux-perf`). A release-like sluice binary with symbols: by
# default `cargo build --profile profiling -p sluice-dataplane` (release + debug info).
# Runs under `flock /tmp/sluice-bench.lock` so it never overlaps a benchmark.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

sluice_bin=""
only=""
scenario=1
n1=2000
n2=12000
conns=64
out=""
do_callgrind=1
do_syscalls=1
churn=0
batching=""
while [ $# -gt 0 ]; do
    case "$1" in
        --sluice-bin) sluice_bin=$2; shift 2 ;;
        --only) only=$2; shift 2 ;;
        --scenario) scenario=$2; shift 2 ;;
        --n1) n1=$2; shift 2 ;;
        --n2) n2=$2; shift 2 ;;
        --conns) conns=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --no-callgrind) do_callgrind=0; shift ;;
        --no-syscalls) do_syscalls=0; shift ;;
        --churn) churn=1; shift ;;
        --write-batching) batching=$2; shift 2 ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "profile.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$batching" in
    ""|auto|send|off) ;;
    *) echo "profile.sh: --write-batching must be auto, send or off" >&2; exit 2 ;;
esac
case "$scenario" in
    1|2) ;;
    *) echo "profile.sh: --scenario must be 1 or 2" >&2; exit 2 ;;
esac
if [ "$n2" -le "$n1" ]; then
    echo "profile.sh: --n2 must be larger than --n1" >&2
    exit 2
fi

if [ -z "${SLUICE_PROFILE_LOCKED:-}" ]; then
    export SLUICE_PROFILE_LOCKED=1
    exec flock /tmp/sluice-bench.lock "$0" \
        ${sluice_bin:+--sluice-bin "$sluice_bin"} ${only:+--only "$only"} \
        --scenario "$scenario" --n1 "$n1" --n2 "$n2" --conns "$conns" ${out:+--out "$out"} \
        $([ $do_callgrind = 1 ] || echo --no-callgrind) \
        $([ $do_syscalls = 1 ] || echo --no-syscalls) \
        $([ $churn = 0 ] || echo --churn) ${batching:+--write-batching "$batching"}
fi

need_pkgs=()
command -v valgrind >/dev/null || need_pkgs+=(valgrind)
command -v h2load >/dev/null || need_pkgs+=(nghttp2-client)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_pkgs+=(nginx-light)
command -v perf >/dev/null || need_pkgs+=(linux-perf)
command -v taskset >/dev/null || need_pkgs+=(util-linux)
command -v curl >/dev/null || need_pkgs+=(curl)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "profile.sh: installing ${need_pkgs[*]}" >&2
    apt-get install -y "${need_pkgs[@]}" >&2
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

if [ -z "$sluice_bin" ] && [ "$only" != nginx ]; then
    (cd "$root" && cargo build -q --profile profiling -p sluice-dataplane --bin sluice-dataplane)
    sluice_bin="${CARGO_TARGET_DIR:-$root/target}/profiling/sluice-dataplane"
fi

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=${out:-${SLUICE_CACHE:-$HOME/.cache/sluice}/bench/results/profile-$stamp}
mkdir -p "$out"
work=$(mktemp -d /tmp/sluice-profile.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

cpus=$(nproc)
pin_proxy=""
pin_load=""
if [ "$cpus" -ge 2 ]; then
    pin_proxy="taskset -c 0"
    pin_load="taskset -c 1"
fi

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

nginx_head() {
    cat <<EOF
worker_processes 1;
daemon off;
master_process $2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 10240; }
EOF
}
nginx_temp() {
    for t in client_body proxy fastcgi uwsgi scgi; do echo "    ${t}_temp_path $1/$t;"; done
}

# The origin, as sluice-bench starts it.
origin=$work/origin
mkdir -p "$origin"
{
    nginx_head "$origin" on
    echo "http { access_log off;"
    nginx_temp "$origin"
    echo '  server { listen 127.0.0.1:1980; default_type text/plain;'
    echo '    location / { return 200 "hello world\n"; } } }'
} >"$origin/nginx.conf"
if curl -s -o /dev/null --max-time 1 http://127.0.0.1:1980/; then
    echo "profile.sh: something already listens on 127.0.0.1:1980" >&2
    exit 1
fi
$pin_proxy "$nginx_bin" -p "$origin" -c "$origin/nginx.conf" -e "$origin/error.log" &
pids+=($!)

wait_ready() { # port
    for _ in $(seq 1 600); do
        if [ "$(curl -s --max-time 2 "http://127.0.0.1:$1/hello" 2>/dev/null)" = "hello world" ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "profile.sh: proxy on port $1 never answered GET /hello" >&2
    return 1
}

# Starts proxy $1 (sluice|nginx) listening on $2, the command prefixed by $3 (valgrind or
# nothing); sets proxy_pid.
start_proxy() {
    local which=$1 port=$2 prefix=$3 dir=$work/$1-$2
    mkdir -p "$dir"
    if [ "$which" = sluice ]; then
        $prefix "$sluice_bin" --standalone "$root/bench/config/scenario$scenario.yaml" \
            --listen-http "127.0.0.1:$port" --listen-https 127.0.0.1:0 \
            --admin "127.0.0.1:$(free_port)" --workers 1 \
            ${batching:+--write-batching "$batching"} >"$dir/log" 2>&1 &
    else
        # Under valgrind nginx runs as a single process (master_process off) so that the
        # worker's instructions are the ones counted.
        local master=on
        case "$prefix" in valgrind*) master=off ;; esac
        {
            nginx_head "$dir" $master
            echo "http { access_log off;"
            nginx_temp "$dir"
            echo '  upstream backend { server 127.0.0.1:1980; keepalive 320; }'
            echo "  server { listen 127.0.0.1:$port;"
            echo '    location / { proxy_pass http://backend; proxy_http_version 1.1;'
            echo '      proxy_set_header Connection ""; } } }'
        } >"$dir/nginx.conf"
        $prefix "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/log" 2>&1 &
    fi
    proxy_pid=$!
    pids+=("$proxy_pid")
}

stop_proxy() { # pid which
    if [ "$2" = nginx ]; then kill -QUIT "$1" 2>/dev/null || true; else kill -TERM "$1" 2>/dev/null || true; fi
    for _ in $(seq 1 300); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$1" 2>/dev/null || true
}

load() { # port n
    local close=()
    [ $churn = 1 ] && close=(-H "Connection: close")
    $pin_load h2load --h1 -n "$2" -c "$conns" -t 1 "${close[@]}" "http://127.0.0.1:$1/hello" >"$work/h2load.log" 2>&1
    if ! grep -q "requests: $2 total, $2 started, $2 done, $2 succeeded" "$work/h2load.log"; then
        echo "profile.sh: h2load did not complete $2 requests:" >&2
        cat "$work/h2load.log" >&2
        return 1
    fi
}

# Prints a markdown table of a callgrind file's instructions per request grouped by where
# the code comes from (see the header). $1 file, $2 requests.
by_origin() {
    callgrind_annotate --auto=no --threshold=100 "$1" 2>/dev/null | awk -v n="$2" '
        /PROGRAM TOTALS/ { next }
        /^ *[0-9,]+ \( *[0-9.]+%\)  / {
            c = $1; gsub(",", "", c)
            rest = $0; sub(/^ *[0-9,]+ \( *[0-9.]+%\)  */, "", rest)
            i = index(rest, ":"); file = substr(rest, 1, i - 1); fn = substr(rest, i + 1)
            sub(/^<+/, "", fn); split(fn, parts, "::"); owner = parts[1]
            if (file ~ /memmove|memset|memcpy/) k = "memcpy/memset (libc)"
            else if (file ~ /index\.crates\.io/) {
                k = file; sub(/.*index\.crates\.io-[^\/]*\//, "", k); sub(/\/.*/, "", k)
                sub(/-[0-9][0-9.]*$/, "", k); if (k ~ /^libmimalloc/) k = "mimalloc"
            } else if (file ~ /^\/rustc\//) {
                k = owner; gsub("_", "-", k)
                if (owner ~ /^sluice/) k = "sluice"
                else if (owner ~ /^(core|std|alloc)$/) k = "Rust std (drop glue, generic code)"
            }
            else if (file ~ /^\.\//) k = "libc, other"
            else if (owner ~ /^sluice/ || file ~ /\/(dataplane|lib|crds)\//) k = "sluice"
            else k = "other"
            sum[k] += c; total += c
        }
        END {
            print "| code from | instructions / request | share |"
            print "|---|---:|---:|"
            for (k in sum) if (sum[k] / n >= 50) printf "| %s | %d | %.1f%% |\n", k, sum[k] / n, 100 * sum[k] / total | "sort -t\"|\" -k3 -rn"
            close("sort -t\"|\" -k3 -rn")
            printf "| total | %d | |\n", total / n
        }'
}

callgrind_ir() { # which n -> sets ir to callgrind's total Ir of the run
    local which=$1 n=$2 port
    port=$(free_port)
    local file=$out/callgrind.$which.$n.out
    rm -f "$file"*
    start_proxy "$which" "$port" "valgrind --tool=callgrind --callgrind-out-file=$file"
    wait_ready "$port"
    load "$port" "$n"
    stop_proxy "$proxy_pid" "$which"
    wait "$proxy_pid" 2>/dev/null || true
    ir=0
    for f in "$file"*; do
        local x
        x=$(awk '/^summary:/ {print $2}' "$f")
        ir=$((ir + ${x:-0}))
    done
}

count_syscalls() { # target port n file
    perf stat -x, -e 'syscalls:sys_enter_*' -p "$1" -o "$4" &
    local perf_pid=$!
    sleep 0.5
    load "$2" "$3"
    kill -INT "$perf_pid"
    wait "$perf_pid" || true
}

syscalls() { # which -> writes $out/syscalls.$which.txt, sets spr to the total per request
    local which=$1 port
    port=$(free_port)
    start_proxy "$which" "$port" "$pin_proxy"
    wait_ready "$port"
    load "$port" 20000 # warm-up: connections to the origin are open and pooled
    local target=$proxy_pid
    if [ "$which" = nginx ]; then
        target=$(pgrep -P "$proxy_pid" | head -1 || true) # the worker
        target=${target:-$proxy_pid}
    fi
    local a=$work/perf.$which.a b=$work/perf.$which.b
    count_syscalls "$target" "$port" "$n1" "$a"
    count_syscalls "$target" "$port" "$n2" "$b"
    stop_proxy "$proxy_pid" "$which"
    python3 - "$a" "$b" "$n1" "$n2" >"$out/syscalls.$which.txt" <<'EOF'
import sys
def read(path):
    counts = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) < 3 or not parts[0].replace(".", "").isdigit():
            continue
        name = parts[2].replace("syscalls:sys_enter_", "")
        counts[name] = float(parts[0])
    return counts
a, b = read(sys.argv[1]), read(sys.argv[2])
n = int(sys.argv[4]) - int(sys.argv[3])
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / n, k) for k in set(a) | set(b))
total = sum(r for r, _ in rows)
for per, name in reversed(rows):
    if abs(per) >= 0.005:
        print(f"{name} {per:.3f}")
print(f"total {total:.3f}")
EOF
    spr=$(awk '/^total/ {print $2}' "$out/syscalls.$which.txt")
}

proxies=(sluice nginx)
[ -n "$only" ] && proxies=("$only")
{
    echo "# Per-request cost, scenario $scenario for sluice (GET /hello, $([ $churn = 1 ] && echo 'Connection: close, one request per connection' || echo keep-alive), h2load -c $conns), $stamp"
    echo
    echo "- commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (dirty)')"
    [ -n "$sluice_bin" ] && echo "- sluice binary: $sluice_bin"
    echo "- sluice write batching: ${batching:-auto (its default)}"
    echo "- nginx: $("$nginx_bin" -v 2>&1 | sed 's/.*: //')"
    echo "- N1=$n1, N2=$n2; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "| proxy | user instructions / request | syscalls / request |"
    echo "|---|---:|---:|"
} >"$out/summary.md"
for p in "${proxies[@]}"; do
    ipr="-"
    spr="-"
    if [ $do_callgrind = 1 ]; then
        callgrind_ir "$p" "$n1"
        ir1=$ir
        callgrind_ir "$p" "$n2"
        ir2=$ir
        ipr=$(( (ir2 - ir1) / (n2 - n1) ))
        for f in "$out/callgrind.$p.$n2.out"*; do
            callgrind_annotate --inclusive=yes "$f" >"$f.inclusive.txt" 2>/dev/null || true
            callgrind_annotate "$f" >"$f.self.txt" 2>/dev/null || true
        done
        rm -f "$out/callgrind.$p.$n1.out"*
    fi
    if [ $do_syscalls = 1 ]; then
        syscalls "$p"
    fi
    echo "| $p | $ipr | $spr |" >>"$out/summary.md"
done
if [ $do_callgrind = 1 ] && [ -f "$out/callgrind.sluice.$n2.out" ]; then
    { echo; echo "sluice's user-space instructions by where the code comes from (the N2 run ÷ N2):"
      echo; by_origin "$out/callgrind.sluice.$n2.out" "$n2"; } >>"$out/summary.md"
fi
if [ $do_syscalls = 1 ]; then
    for p in "${proxies[@]}"; do
        { echo; echo "syscalls per request, $p:"; echo '```'; cat "$out/syscalls.$p.txt"; echo '```'; } >>"$out/summary.md"
    done
fi
cat "$out/summary.md"
