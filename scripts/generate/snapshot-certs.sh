#!/usr/bin/env bash
# Prints the two Secrets of the snapshot channel (controller <-> dataplanes mutual TLS) for a
# plain-manifest install (manifests/sluice.yaml), with a fresh private CA made by openssl:
#
#   scripts/generate/snapshot-certs.sh [NAMESPACE [RELEASE]] | kubectl apply -f -
#
# NAMESPACE defaults to sluice, RELEASE (the object-name prefix) to sluice. The Helm chart
# generates the same Secrets itself (snapshotTLS.mode=generate) or has cert-manager issue them.
set -euo pipefail
ns=${1:-sluice}
name=${2:-sluice}
svc="$name-controller"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
umask 077
openssl ecparam -name prime256v1 -genkey -noout -out ca.key
openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=$name-snapshot-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out ca.crt 2>/dev/null
issue() { # name subject extensions
    openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
    printf '%s\n' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
}
issue controller "/CN=$svc" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$svc,DNS:$svc.$ns,DNS:$svc.$ns.svc,DNS:$svc.$ns.svc.cluster.local"
issue dataplane "/CN=$name-dataplane" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
b64() { base64 -w0 <"$1"; }
for who in controller dataplane; do
    cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: $name-$who-tls
  namespace: $ns
  labels: {app.kubernetes.io/name: sluice, app.kubernetes.io/instance: $name, app.kubernetes.io/component: $who}
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$who.crt")
  tls.key: $(b64 "$who.key")
  ca.crt: $(b64 ca.crt)
YAML
done
