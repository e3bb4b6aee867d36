# Shared by the scripts that build third-party test binaries from the Go module proxy
# (helm.sh, otelcol.sh, prometheus.sh). Source it after defining `die`; the caller sets
# SLUICE_CACHE. Go's module and build caches live under $SLUICE_CACHE/go, so a second
# build takes a moment.

# Prints the Go toolchain to use (go on PATH, else /usr/local/go/bin/go), checked to be at
# least 1.MINOR; `what` names the build in the error.
#   go_toolchain MINOR WHAT
go_toolchain() {
    local need=$1 what=$2 go v minor
    go=$(command -v go 2>/dev/null || true)
    [ -n "$go" ] || { [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go; }
    [ -n "$go" ] || die "no Go toolchain (need go >= 1.$need on PATH or in /usr/local/go) to build $what"
    v=$(GOTOOLCHAIN=local "$go" env GOVERSION)
    v=${v#go}
    minor=$(echo "$v" | cut -d. -f2)
    { [ "${v%%.*}" -gt 1 ] || [ "$minor" -ge "$need" ]; } || die "go $v is too old to build $what (need >= 1.$need)"
    echo "$go"
}

# Builds PACKAGE of the module in SRC into OUT (static, trimmed, module proxy only,
# read-only go.mod), with extra `go build` arguments.
#   go_build GO SRC OUT PACKAGE [ARG...]
go_build() {
    local go=$1 src=$2 out=$3 pkg=$4
    shift 4
    mkdir -p "$SLUICE_CACHE/go/mod" "$SLUICE_CACHE/go/build"
    (
        cd "$src"
        env GOMODCACHE="$SLUICE_CACHE/go/mod" GOCACHE="$SLUICE_CACHE/go/build" \
            GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
            CGO_ENABLED=0 GOWORK=off \
            "$go" build "$@" -o "$out" "$pkg"
    )
}
