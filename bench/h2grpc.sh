#!/usr/bin/env bash
# HTTP/2 and gRPC benchmark: nginx and Sluice side by side in the same run, by ratio.
#
#   h2load (CPU 1) --h2c--> proxy under test (CPU 0) --> origin (CPU 0)
#
# Scenarios (each proxy gets one worker: nginx `worker_processes 1`, sluice `--workers 1`):
#   h2    GET /hello over h2c; upstream HTTP/1.1 keep-alive to an nginx origin that returns
#         `200 hello world\n` (nginx: `listen ... http2` + proxy_pass, upstream keepalive).
#   grpc  gRPC unary /sluice.test.v1.Echo/Unary (a 5-byte message) over h2c; upstream HTTP/2
#         with prior knowledge to sluice-grpc-echo (tonic). nginx: `grpc_pass` to an upstream
#         with keepalive; Sluice: ApisixUpstream `scheme: grpc`.
# The metric is requests per proxy CPU-second (user+system time of the proxy's processes
# over the measured h2load run, after a separate warm-up run), reported with the request
# rate beside it and the Sluice/nginx ratio of each round; the summary is the median.
#
# Usage: flock /tmp/sluice-bench.lock bench/h2grpc.sh [--rounds N] [--duration SECONDS]
#            [--clients C] [--streams M] [--bin-dir DIR]
# --bin-dir must hold release builds of sluice-dataplane and sluice-grpc-echo
# (default $CARGO_TARGET_DIR/release; build: cargo build --release -p sluice-dataplane
# -p sluice-testkit --bins). Needs nginx, h2load (nghttp2-client), taskset, curl.
# Every process listens on 127.0.0.1 only and is stopped by its pid at the end.
set -euo pipefail

rounds=3
duration=10
clients=16
streams=10
bin_dir="${CARGO_TARGET_DIR:-target}/release"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --streams) streams=$2; shift 2 ;;
        --bin-dir) bin_dir=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
for cmd in nginx h2load taskset curl; do
    command -v "$cmd" >/dev/null || { echo "missing $cmd (scripts/install/bench-deps.sh)" >&2; exit 1; }
done
for b in sluice-dataplane sluice-grpc-echo; do
    [ -x "$bin_dir/$b" ] || { echo "missing $bin_dir/$b" >&2; exit 1; }
done

here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/sluice-h2grpc.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

cpus=$(taskset -pc $$ | sed 's/.*: //')
proxy_cpu=0
load_cpu=1
case "$cpus" in *,*|*-*) ;; *) load_cpu=$proxy_cpu ;; esac
tck=$(getconf CLK_TCK)

# Origin nginx (hello), origin gRPC (tonic), baseline nginx proxy.
origin_port=1980
grpc_port=50051
nginx_port=19081
sluice_port=19082
for p in $origin_port $grpc_port $nginx_port $sluice_port; do
    if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
        echo "port $p is in use; stop what listens there first" >&2; exit 1
    fi
done

ngx_head() { # prefix
    cat <<EOF
worker_processes 1;
daemon off;
master_process on;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 10240; }
EOF
}
ngx_temp() {
    echo "client_body_temp_path $1/cb; proxy_temp_path $1/px; fastcgi_temp_path $1/fc; uwsgi_temp_path $1/uw; scgi_temp_path $1/sc;"
}

mkdir -p "$work/origin" "$work/nginx"
{ ngx_head "$work/origin"; cat <<EOF
http {
    access_log off;
    $(ngx_temp "$work/origin")
    server {
        listen 127.0.0.1:$origin_port;
        default_type text/plain;
        location / { return 200 "hello world\n"; }
    }
}
EOF
} > "$work/origin/nginx.conf"
{ ngx_head "$work/nginx"; cat <<EOF
http {
    access_log off;
    $(ngx_temp "$work/nginx")
    upstream backend { server 127.0.0.1:$origin_port; keepalive 320; }
    upstream grpc_backend { server 127.0.0.1:$grpc_port; keepalive 320; }
    server {
        listen 127.0.0.1:$nginx_port http2;
        http2_max_concurrent_streams 1024;
        # NB: the default (1000) makes nginx close each h2load connection after 1000
        # requests, and h2load does not reconnect.
        keepalive_requests 10000000;
        location /hello {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location /sluice.test.v1.Echo/ {
            grpc_pass grpc://grpc_backend;
        }
    }
}
EOF
} > "$work/nginx/nginx.conf"

taskset -c $proxy_cpu nginx -p "$work/origin" -c "$work/origin/nginx.conf" -e "$work/origin/error.log" &
pids+=($!)
taskset -c $proxy_cpu "$bin_dir/sluice-grpc-echo" --listen 127.0.0.1:$grpc_port >"$work/grpc-echo.log" 2>&1 &
pids+=($!)
taskset -c $proxy_cpu nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" &
nginx_pid=$!
pids+=($nginx_pid)
taskset -c $proxy_cpu "$bin_dir/sluice-dataplane" --standalone "$here/config/h2grpc.yaml" \
    --listen-http 127.0.0.1:$sluice_port --listen-https 127.0.0.1:19443 \
    --admin 127.0.0.1:19091 --workers 1 >"$work/sluice.log" 2>&1 &
sluice_pid=$!
pids+=($sluice_pid)

# gRPC request: one uncompressed message, EchoRequest{message: "hello"}.
printf '\x00\x00\x00\x00\x07\x0a\x05hello' > "$work/grpc-req.bin"
grpc_args=(-H "content-type: application/grpc" -H "te: trailers" -d "$work/grpc-req.bin")

wait_ready() { # port
    for _ in $(seq 1 100); do
        if curl -sf --http2-prior-knowledge "http://127.0.0.1:$1/hello" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "proxy on port $1 did not become ready" >&2; exit 1
}
wait_ready $nginx_port
wait_ready $sluice_port
# Each proxy must answer the gRPC call with grpc-status 0 before it is measured.
for port in $nginx_port $sluice_port; do
    out=$(curl -s --http2-prior-knowledge -H "content-type: application/grpc" -H "te: trailers" \
        --data-binary @"$work/grpc-req.bin" -o /dev/null -v \
        "http://127.0.0.1:$port/sluice.test.v1.Echo/Unary" 2>&1)
    echo "$out" | grep -qi "grpc-status: 0" || { echo "gRPC check failed on port $port:"; echo "$out"; exit 1; } >&2
done

proxy_ticks() { # pid -> CPU ticks of the process and its children (nginx workers)
    local total=0 p
    for p in $1 $(pgrep -P "$1" || true); do
        if [ -r "/proc/$p/stat" ]; then
            total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
        fi
    done
    echo $total
}

run() { # name pid port path extra-args... -> prints "succeeded req_per_s cpu_s"
    local name=$1 pid=$2 port=$3 path=$4; shift 4
    taskset -c $load_cpu h2load -t1 -c "$clients" -m "$streams" -D 2 "$@" \
        "http://127.0.0.1:$port$path" >/dev/null 2>&1
    local before after out
    before=$(proxy_ticks "$pid")
    out=$(taskset -c $load_cpu h2load -t1 -c "$clients" -m "$streams" -D "$duration" "$@" \
        "http://127.0.0.1:$port$path" 2>&1)
    after=$(proxy_ticks "$pid")
    local ok rps
    ok=$(echo "$out" | awk '/^requests:/ {print $8}')
    rps=$(echo "$out" | awk '/^finished in/ {print $4}')
    local fail
    fail=$(echo "$out" | awk '/^requests:/ {print $10}')
    local codes
    codes=$(echo "$out" | awk '/^status codes:/')
    echo "$ok $rps $(awk -v t=$((after - before)) -v h="$tck" 'BEGIN {printf "%.2f", t / h}') $fail" 
    echo "    $name: $codes" >&2
}

ts=$(date -u +%Y%m%dT%H%M%SZ)
history="${SLUICE_CACHE:-$HOME/.cache/sluice}/bench/results"  # history outside the clone (bench/README.md)
mkdir -p "$history"
report="$history/h2grpc-$(uname -m)-$ts.md"
{
    echo "# HTTP/2 and gRPC: Sluice vs nginx ($ts)"
    echo
    echo "h2load -t1 -c$clients -m$streams -D${duration}s per measurement, $rounds rounds;"
    echo "proxy+origin pinned to CPU $proxy_cpu, h2load to CPU $load_cpu; one worker each."
    echo "nginx $(nginx -v 2>&1 | sed 's/.*\///'); sluice $("$bin_dir/sluice-dataplane" --version 2>/dev/null | head -1)"
    echo
    echo "| scenario | round | nginx req/s | nginx CPU-s | nginx req/CPU-s | sluice req/s | sluice CPU-s | sluice req/CPU-s | ratio req/CPU-s | ratio req/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$report"

declare -A ratios
for scenario in h2 grpc; do
    for r in $(seq 1 "$rounds"); do
        if [ $scenario = h2 ]; then path=/hello; extra=(); else path=/sluice.test.v1.Echo/Unary; extra=("${grpc_args[@]}"); fi
        read -r n_ok n_rps n_cpu n_fail < <(run nginx $nginx_pid $nginx_port $path "${extra[@]}")
        read -r s_ok s_rps s_cpu s_fail < <(run sluice $sluice_pid $sluice_port $path "${extra[@]}")
        line=$(awk -v no="$n_ok" -v nr="$n_rps" -v nc="$n_cpu" -v so="$s_ok" -v sr="$s_rps" -v sc="$s_cpu" \
            -v sc_="$scenario" -v r="$r" 'BEGIN {
                ne = no / nc; se = so / sc;
                printf "| %s | %d | %.0f | %.2f | %.0f | %.0f | %.2f | %.0f | %.2f | %.2f |", sc_, r, nr, nc, ne, sr, sc, se, se / ne, sr / nr }')
        echo "$line" | tee -a "$report"
        [ "$n_fail" = 0 ] && [ "$s_fail" = 0 ] || echo "  (failed requests: nginx $n_fail, sluice $s_fail)" | tee -a "$report"
        ratios[$scenario]+="$(echo "$line" | awk -F'|' '{print $10}') "
    done
done
{
    echo
    echo "Median Sluice/nginx requests per CPU-second:"
    for scenario in h2 grpc; do
        med=$(echo "${ratios[$scenario]}" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
        echo "- $scenario: ${med}x (rounds: ${ratios[$scenario]})"
    done
} | tee -a "$report"
echo "report: $report"
cp "$report" "$here/results/latest-h2grpc-$(uname -m).md"  # the reference copy in the tree
echo "reference copy: bench/results/latest-h2grpc-$(uname -m).md"
