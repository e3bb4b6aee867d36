#!/usr/bin/env bash
# Renders docs/images/grafana-11719.png: the panels of charts/sluice/dashboards/sluice-apisix.json
# (the queries of APISIX's Grafana dashboard 11719) evaluated by a real Prometheus that scraped
# a real standalone dataplane under load. Grafana itself is not built: the panels are drawn
# with matplotlib from Prometheus's query_range answers (scripts/generate/dashboard-render.py says how
# the dashboard's variables are set).
#
# Needs: cargo, Go (for scripts/install/prometheus.sh), wrk, python3 with venv. Takes about
# 3 minutes once the binaries are built (a cold Prometheus build takes longer: see the doc).
#
#   scripts/generate/dashboard-render.sh                       write docs/images/grafana-11719.png
#   LOAD_SECONDS=60 scripts/generate/dashboard-render.sh OUT   shorter load, another file
#   PROFILE=dev scripts/generate/dashboard-render.sh           from a debug build
set -euo pipefail
cd "$(dirname "$0")/../.."

SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
log() { echo "dashboard-render: $*" >&2; }

command -v wrk >/dev/null || { log "error: wrk not found (apt-get install wrk)"; exit 1; }

prometheus=$(scripts/install/prometheus.sh)

# PROFILE=dev renders from a debug build (quicker to build, slower to serve).
profile=${PROFILE:-release}
log "building sluice-dataplane and sluice-echo ($profile) ..."
cargo build --profile "$profile" -p sluice-dataplane -p sluice-testkit --bin sluice-dataplane --bin sluice-echo
target="${CARGO_TARGET_DIR:-target}"
dir=$profile
[ "$profile" = dev ] && dir=debug

venv="$SLUICE_CACHE/venv-dashboard"
if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "creating $venv with matplotlib (PyPI) ..."
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet 'matplotlib==3.11.*'
fi

exec "$venv/bin/python" scripts/generate/dashboard-render.py \
    --dataplane "$target/$dir/sluice-dataplane" \
    --echo "$target/$dir/sluice-echo" \
    --prometheus "$prometheus" \
    --dashboard charts/sluice/dashboards/sluice-apisix.json \
    --load-seconds "${LOAD_SECONDS:-120}" \
    --out "${1:-docs/images/grafana-11719.png}"
