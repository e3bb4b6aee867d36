#!/usr/bin/env bash
# Coverage-guided fuzzing of the dataplane's parsers with libFuzzer, on the stable toolchain.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]   run each target (default: all) for SECONDS (30)
#   scripts/fuzz.sh --ci [SECONDS]           what scripts/test.sh runs: every target, a fixed
#                                            seed, from the committed corpus only (a run
#                                            explores the same inputs each time: no flakes)
#
# Why libFuzzer through libfuzzer-sys and not cargo-fuzz: cargo-fuzz needs a nightly
# toolchain (-Zsanitizer); the coverage instrumentation libFuzzer needs is reachable on
# stable with -Cpasses=sancov-module and the sanitizer-coverage LLVM options, which is all
# this script sets (no AddressSanitizer: the code under test is safe Rust). afl.rs would
# need its own compiler wrapper and AFL++ build. Builds go under $SLUICE_CACHE/fuzz-target.
#
# Seeds: dataplane/fuzz/corpus/<target>/ (committed). What a run finds that is new goes to a
# scratch corpus under the cache, not into the clone. A crash stops the run, leaves its
# input in $SLUICE_CACHE/fuzz-artifacts/<target>/ and fails the script: turn it into a
# regression test.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=
if [ "${1:-}" = "--ci" ]; then
    ci=1
    shift
fi
seconds="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(h1_response path_normalize snapshot_compile translate_yaml router h1_body host_decision mtls_skip stream_sniff)

cache="${SLUICE_CACHE:-$HOME/.cache/sluice}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR="$cache/fuzz-target"
# NB: --target keeps these flags off build scripts, which are not linked with libFuzzer.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares"
echo "==> fuzz: building ${targets[*]} ($triple)"
(cd dataplane/fuzz && cargo build --release --locked --quiet --target "$triple" $(printf -- '--bin %s ' "${targets[@]}"))

for t in "${targets[@]}"; do
    scratch="$cache/fuzz-corpus/$t"
    artifacts="$cache/fuzz-artifacts/$t"
    seed=()
    if [ -n "$ci" ]; then
        scratch="$(mktemp -d)"
        seed=(-seed=1)
    fi
    mkdir -p "$scratch" "$artifacts"
    echo "==> fuzz: $t for ${seconds}s"
    log="$cache/fuzz-artifacts/$t.log"
    status=0
    "$CARGO_TARGET_DIR/$triple/release/$t" \
        -max_total_time="$seconds" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "${seed[@]}" \
        "$scratch" "dataplane/fuzz/corpus/$t" >"$log" 2>&1 || status=$?
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|SUMMARY)' "$log" || true
    [ -z "$ci" ] || rm -rf "$scratch"
    if [ "$status" -ne 0 ]; then
        tail -n 40 "$log" >&2
        echo "fuzz: $t failed (exit $status); the input is in $artifacts/" >&2
        exit 1
    fi
done
