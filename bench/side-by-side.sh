#!/usr/bin/env bash
# Two dataplane configurations loaded at the same time, for small differences between
# them (issue 4: the cost of scenario 2's plugins). `sluice-bench proxy --scenario 2`
# measures scenario 2 against scenario 1 this way in every round; this script compares any
# two configurations, e.g. a configuration against itself to calibrate the method, or one
# plugin at a time to attribute a cost.
#
#   bench/side-by-side.sh [--bin PATH] [--rounds N] [--duration SECS] A.yaml B.yaml
#
# Both dataplanes (one worker each) and the origin (nginx, `200 hello world`, on
# 127.0.0.1:1980 as in sluice-bench) run on CPU 0; two wrk processes (-c32 --latency each,
# as sluice-bench runs wrk) on CPU 1 load A and B during the same seconds. NB: the ratio
# depends on the client a little: without --latency, scenario 2 ÷ scenario 1 read about
# one point lower (0.941× against 0.952×, issue 4). Per round it prints each dataplane's requests per
# CPU-second (its threads' CPU time in ns, from /proc/PID/task/*/schedstat) and B ÷ A.
# The machine's speed drifts act on both alike, which sequential runs cannot offer on a
# shared VM. NB: A starts first (dataplane and wrk) and can gain about a point over B
# (scenario 1 against itself: 0.977-1.010x); for a small difference, run both orders.
#
# Needs nginx, wrk, taskset; runs under `flock /tmp/sluice-bench.lock`.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=""
rounds=3
duration=10
while [ $# -gt 2 ]; do
    case "$1" in
        --bin) bin=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        *) echo "side-by-side.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ $# -ne 2 ]; then
    sed -n '2,16p' "$0" >&2
    exit 2
fi
a=$(realpath "$1")
b=$(realpath "$2")
bin=${bin:-${CARGO_TARGET_DIR:-$root/target}/release/sluice-dataplane}
[ -x "$bin" ] || { echo "side-by-side.sh: no dataplane binary at $bin (cargo build --release -p sluice-dataplane)" >&2; exit 1; }

if [ -z "${SLUICE_SIDE_LOCKED:-}" ]; then
    export SLUICE_SIDE_LOCKED=1
    exec flock /tmp/sluice-bench.lock "$0" --bin "$bin" --rounds "$rounds" --duration "$duration" "$a" "$b"
fi

work=$(mktemp -d /tmp/sluice-side.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.3
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

mkdir -p "$work/origin"
cat >"$work/origin/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/origin/nginx.pid;
error_log $work/origin/error.log warn;
events { worker_connections 10240; }
http {
    access_log off;
    client_body_temp_path $work/origin/cb; proxy_temp_path $work/origin/p;
    fastcgi_temp_path $work/origin/f; uwsgi_temp_path $work/origin/u; scgi_temp_path $work/origin/s;
    server { listen 127.0.0.1:1980; default_type text/plain;
             location / { return 200 "hello world\n"; } }
}
NGINX
taskset -c 0 "$(command -v nginx || echo /usr/sbin/nginx)" -p "$work/origin" \
    -c "$work/origin/nginx.conf" -e "$work/origin/error.log" &
pids+=($!)

start() { # config port -> pid
    taskset -c 0 "$bin" --standalone "$1" --listen-http "127.0.0.1:$2" \
        --listen-https 127.0.0.1:0 --admin "127.0.0.1:$(free_port)" --workers 1 \
        >"$work/sluice-$2.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 1 100); do
        curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$2/hello" && return 0
        sleep 0.1
    done
    echo "side-by-side.sh: the dataplane on port $2 never answered" >&2
    cat "$work/sluice-$2.log" >&2
    exit 1
}
port_a=$(free_port)
start "$a" "$port_a"
pid_a=${pids[-1]}
port_b=$(free_port)
start "$b" "$port_b"
pid_b=${pids[-1]}

# CPU time of a process's threads in ns, from the scheduler (finer than /proc/PID/stat's
# 10 ms ticks, which are 0.3% of a round's share).
cpu_ns() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {printf "%.0f\n", s}'; }
both() { # seconds -> writes $work/wa $work/wb
    taskset -c 1 wrk -t1 -c32 --latency -d"$1"s "http://127.0.0.1:$port_a/hello" >"$work/wa" &
    local wa=$!
    taskset -c 1 wrk -t1 -c32 --latency -d"$1"s "http://127.0.0.1:$port_b/hello" >"$work/wb" &
    wait "$wa" $!
}
both 2 # warm-up: upstream connections are open and pooled
echo "A = $a"
echo "B = $b"
for r in $(seq 1 "$rounds"); do
    a0=$(cpu_ns "$pid_a"); b0=$(cpu_ns "$pid_b")
    both "$duration"
    a1=$(cpu_ns "$pid_a"); b1=$(cpu_ns "$pid_b")
    na=$(awk '/requests in/ {print $1}' "$work/wa")
    nb=$(awk '/requests in/ {print $1}' "$work/wb")
    python3 -c "
ca, cb = ($a1 - $a0) / 1e9, ($b1 - $b0) / 1e9
ra, rb = $na / ca, $nb / cb
print(f'round $r: A {ra:.0f} req/CPU-s ({$na} requests, {ca:.2f} CPU-s), B {rb:.0f} req/CPU-s ({$nb} requests, {cb:.2f} CPU-s), B/A = {rb / ra:.3f}')"
done
