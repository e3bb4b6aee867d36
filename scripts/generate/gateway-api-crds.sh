#!/usr/bin/env bash
# Refreshes the vendored Gateway API CRDs (standard channel) in crds/gateway-api/ and the
# upstream examples used as parser fixtures in crds/tests/fixtures/gateway-api/.
#
# The files come from the Go module proxy (the sigs.k8s.io/gateway-api module at the pinned
# version), not from GitHub, so the bytes are those checksummed by sum.golang.org.
#
#   scripts/generate/gateway-api-crds.sh            # the pinned version below
#   GATEWAY_API_VERSION=v1.6.4 scripts/generate/gateway-api-crds.sh
set -euo pipefail

VERSION="${GATEWAY_API_VERSION:-v1.6.3}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
go mod init sluice.invalid/gateway-api-crds >/dev/null 2>&1
GOFLAGS=-mod=mod go get "sigs.k8s.io/gateway-api@${VERSION}" >/dev/null
MOD="$(go env GOMODCACHE)/sigs.k8s.io/gateway-api@${VERSION}"

DEST="$ROOT/crds/gateway-api"
find "$DEST" -maxdepth 1 -name '*.yaml' -delete
install -m 0644 "$MOD"/config/crd/standard/*.yaml "$DEST"/
install -m 0644 "$MOD"/LICENSE "$DEST"/LICENSE

FIXTURES="$ROOT/crds/tests/fixtures/gateway-api"
mkdir -p "$FIXTURES"
find "$FIXTURES" -maxdepth 1 -name '*.yaml' -delete
(cd "$MOD/examples/standard" && find . -name '*.yaml' -print0) |
    while IFS= read -r -d '' f; do
        # Flatten sub-directories: grpc-routing/gateway.yaml -> grpc-routing--gateway.yaml.
        name="${f#./}"
        install -m 0644 "$MOD/examples/standard/$name" "$FIXTURES/${name//\//--}"
    done
install -m 0644 "$MOD"/LICENSE "$FIXTURES"/LICENSE
echo "$VERSION" > "$DEST/VERSION"
echo "Gateway API ${VERSION}: $(ls "$DEST"/*.yaml | wc -l) CRD files, $(ls "$FIXTURES" | wc -l) example fixtures"
