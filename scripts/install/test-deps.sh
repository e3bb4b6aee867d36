#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine; does nothing when present.
set -euo pipefail

need=()
command -v curl >/dev/null || need+=(curl)
# Plugin tests: a real Redis for the shared rate-limit policy, openssl for RSA test keys.
command -v redis-server >/dev/null || need+=(redis-server)
command -v openssl >/dev/null || need+=(openssl)
# The fuzz targets (scripts/fuzz.sh): libfuzzer-sys compiles libFuzzer's C++ sources.
command -v c++ >/dev/null || need+=(g++)
# kubectl-sluice's completion scripts are tested in the real shells.
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
command -v rustfmt >/dev/null || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    echo "==> installing Debian packages: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
