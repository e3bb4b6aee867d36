#!/usr/bin/env bash
# Sluice quick start: builds Sluice, starts a real backend (sluice-echo on 127.0.0.1:1980) and
# the dataplane in standalone mode with examples/quickstart/, then sends a request through it.
# Keeps serving until Ctrl-C; with QUICKSTART_ONCE=1 it stops after the demo request.
set -euo pipefail
cd "$(dirname "$0")/.."

HTTP=${SLUICE_HTTP:-127.0.0.1:9080}
ADMIN=${SLUICE_ADMIN:-127.0.0.1:9091}
BACKEND=127.0.0.1:1980

echo "==> building (cargo build --release; the first build takes a few minutes)"
cargo build --release --quiet -p sluice-dataplane -p sluice-testkit --bins

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

target/release/sluice-echo --listen "$BACKEND" --name quickstart-backend &
pids+=($!)
target/release/sluice-dataplane --standalone examples/quickstart \
    --listen-http "$HTTP" --admin "$ADMIN" --workers 1 &
pids+=($!)

for _ in $(seq 1 100); do
    curl -fsS "http://$ADMIN/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done

echo
echo "==> curl -H 'Host: demo.sluice.local' http://$HTTP/hello"
curl -sS -i -H 'Host: demo.sluice.local' "http://$HTTP/hello"
echo
echo "==> curl http://$HTTP/nothing-here   (no route: 404)"
curl -sS -i "http://$HTTP/nothing-here"
echo
echo "==> curl http://$ADMIN/snapshot"
curl -sS "http://$ADMIN/snapshot"
echo

if [ "${QUICKSTART_ONCE:-0}" = "1" ]; then
    exit 0
fi
echo "==> Sluice is serving on http://$HTTP (admin on http://$ADMIN)."
echo "    Edit examples/quickstart/*.yaml and it reloads. Ctrl-C to stop."
wait
