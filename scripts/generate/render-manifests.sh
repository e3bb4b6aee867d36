#!/usr/bin/env bash
# Renders manifests/sluice.yaml: the Helm chart with its default values, release `sluice` in
# namespace `sluice`, CRDs included, for users who apply plain YAML. The chart-generated
# snapshot-channel Secrets are left out (they would hold a CA key published in the repo, and
# differ on every render): create them with scripts/generate/snapshot-certs.sh (manifests/README.md).
#
#   scripts/generate/render-manifests.sh            rewrite manifests/sluice.yaml
#   scripts/generate/render-manifests.sh --stdout   print what it would write (the drift test
#                                          in e2e/tests/chart.rs compares this)
set -euo pipefail
cd "$(dirname "$0")/../.."

helm=${SLUICE_HELM:-$(scripts/install/helm.sh)}
out=manifests/sluice.yaml

render() {
    echo "# Sluice, rendered from charts/sluice with default values (release sluice, namespace"
    echo "# sluice) by scripts/generate/render-manifests.sh. Do not edit: change the chart and re-render."
    echo "# Needs the namespace and the snapshot-channel Secrets first: see manifests/README.md."
    HELM_CACHE_HOME=$(mktemp -d) HELM_CONFIG_HOME=$(mktemp -d) HELM_DATA_HOME=$(mktemp -d) \
        "$helm" template sluice charts/sluice --namespace sluice --include-crds |
        awk '
            function flush() { if (doc != "" && !skip) printf "%s", doc; doc = ""; skip = 0 }
            /^---$/ { flush(); doc = $0 "\n"; next }
            /^# Source: sluice\/templates\/snapshot-tls-secret\.yaml$/ { skip = 1 }
            { doc = doc $0 "\n" }
            END { flush() }
        '
}

if [ "${1:-}" = --stdout ]; then
    render
else
    mkdir -p manifests
    render >"$out.tmp"
    mv "$out.tmp" "$out"
    echo "wrote $out" >&2
fi
