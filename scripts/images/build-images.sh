#!/usr/bin/env bash
# Builds the Sluice images without a container engine: optimised, stripped binaries
# (cargo profile `dist`, see Cargo.toml) for linux/amd64
# (rustup's toolchain) and linux/arm64 (cross-compiled with Debian's rustc-web, which ships
# an aarch64 standard library), one OCI image per architecture from scratch with the
# runtime files they need (scripts/images/image-rootfs.sh, the same layout as the Dockerfile) and a
# non-root user (65532), then one multi-arch OCI index, written as an OCI archive:
#
#   scripts/images/build-images.sh [--profile dist|release|fast|dev] [--out DIR]
#                           [--amd64-bins DIR] [--arm64-bins DIR] [--arches "amd64 arm64"]
#
#   --arches builds only some architectures (default both; the index then lists only those).
#
#   --amd64-bins / --arm64-bins take that architecture's sluice-controller and
#   sluice-dataplane from DIR (e.g. a CI artifact) instead of building them.
#
#   --tools-only installs what the build needs and stops; --bins-only builds the binaries
#   and stops (no image): scripts/test.sh cross-builds the arm64 ones in the background
#   while other stages run, then passes them back with --arm64-bins.
#
#   dist/sluice-VERSION.oci.tar     the multi-arch index (reference name sluice:VERSION)
#   dist/sluice-VERSION-SIZES.txt   per-architecture image sizes
#
# Load it anywhere with e.g. `skopeo copy --all oci-archive:dist/sluice-0.1.0.oci.tar
# docker://REGISTRY/sluice:0.1.0`. Check it with scripts/images/check-images.sh.
# Installs what this run needs via apt: buildah and binutils always; for arm64 Debian's
# libc6:arm64 (the image's libc), and only when arm64 is built here (no --arm64-bins) the
# cross toolchain and Debian's Rust. (scripts/images/check-images.sh needs skopeo, umoci and, for
# arm64, qemu-user-static.) The arm64 build uses its own target directory
# ($SLUICE_CACHE/target-image-arm64), the amd64 one $SLUICE_CACHE/target-image-amd64.
# The default profile `dist` is release code generation with thin LTO, 16 codegen units and
# stripped symbols; `release` (fat LTO, one codegen unit, line tables) takes much longer on a
# small machine and keeps unstripped binaries; `fast` skips LTO; `dev` is cargo's debug
# build (target/debug, unstripped).
# SLUICE_IMAGE_PROFILE_AMD64 / SLUICE_IMAGE_PROFILE_ARM64 override the profile of one
# architecture (the image labels and the SIZES file say which profile each image has).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

profile=dist
out=dist
amd64_prebuilt=
arm64_prebuilt=
arches="amd64 arm64"
tools_only=
bins_only=
while [ $# -gt 0 ]; do
    case $1 in
    --profile) profile=${2:?--profile needs a name}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --amd64-bins) amd64_prebuilt=${2:?--amd64-bins needs a directory}; shift 2 ;;
    --arm64-bins) arm64_prebuilt=${2:?--arm64-bins needs a directory}; shift 2 ;;
    --arches) arches=${2:?--arches needs e.g. "amd64 arm64"}; shift 2 ;;
    --tools-only) tools_only=1; shift ;;
    --bins-only) bins_only=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -n '/^#/p' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-images: unknown option $1" >&2; exit 2 ;;
    esac
done

for a in $arches; do
    case $a in amd64 | arm64) ;; *) echo "build-images: unknown arch $a (amd64, arm64)" >&2; exit 2 ;; esac
done
want() { case " $arches " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
[ -n "$version" ] || { echo "build-images: no version in Cargo.toml" >&2; exit 1; }
log() { echo "build-images: $*" >&2; }

case $(uname -m) in
x86_64) ;;
*) log "this script builds on x86_64 hosts (amd64 natively, arm64 cross); use the Dockerfile elsewhere"; exit 1 ;;
esac

# ---- tools -------------------------------------------------------------------------------
# Only what this run uses: packaging prebuilt amd64 binaries needs buildah and readelf.
need=()
for c in buildah:buildah readelf:binutils; do
    command -v "${c%%:*}" >/dev/null 2>&1 || need+=("${c#*:}")
done
if want arm64; then
    # The image's libc (scripts/images/image-rootfs.sh takes Debian's multiarch one first).
    [ -e /lib/aarch64-linux-gnu/libc.so.6 ] || [ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] ||
        need+=(libc6:arm64)
    if [ -z "$arm64_prebuilt" ]; then
        # The cross build: linker, cross libc, Debian's Rust and its aarch64 standard library.
        command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu)
        [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ] || need+=(rustc-web cargo-web)
        [ -d /usr/aarch64-linux-gnu/lib ] || need+=(libc6-dev-arm64-cross)
        [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ] || need+=(libstd-rust-web-dev:arm64)
    fi
fi
if [ ${#need[@]} -gt 0 ]; then
    sudo=; [ "$(id -u)" -eq 0 ] || sudo=sudo
    log "installing Debian packages: ${need[*]}"
    case " ${need[*]}" in
    *:arm64*) dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64 ;;
    esac
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

[ -z "$tools_only" ] || exit 0

profile_amd64=${SLUICE_IMAGE_PROFILE_AMD64:-$profile}
profile_arm64=${SLUICE_IMAGE_PROFILE_ARM64:-$profile}
pdir() { if [ "$1" = dev ]; then echo debug; else echo "$1"; fi; }
bins=(--bin sluice-controller --bin sluice-dataplane)
pkgs=(-p sluice-controller -p sluice-dataplane)
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-images.XXXXXX")
cleanup() {
    # NB: buildah's vfs storage is made of read-only copies; make them removable.
    chmod -R u+w "$work" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# ---- binaries ------------------------------------------------------------------------------
t0=$SECONDS
if ! want amd64; then
    amd64_bin=
elif [ -n "$amd64_prebuilt" ]; then
    amd64_bin=$amd64_prebuilt
    profile_amd64="prebuilt ($amd64_prebuilt)"
    log "linux/amd64 binaries: prebuilt in $amd64_bin"
else
    log "building linux/amd64 binaries (cargo $(cargo --version | cut -d' ' -f2), profile $profile_amd64) ..."
    CARGO_TARGET_DIR="$SLUICE_CACHE/target-image-amd64" \
        cargo build --locked --quiet --profile "$profile_amd64" "${pkgs[@]}" "${bins[@]}"
    amd64_bin="$SLUICE_CACHE/target-image-amd64/$(pdir "$profile_amd64")"
fi

if ! want arm64; then
    arm64_bin=
elif [ -n "$arm64_prebuilt" ]; then
    arm64_bin=$arm64_prebuilt
    profile_arm64="prebuilt ($arm64_prebuilt)"
    log "linux/arm64 binaries: prebuilt in $arm64_bin"
else
    log "building linux/arm64 binaries (Debian rustc $(/usr/bin/rustc --version | cut -d' ' -f2), profile $profile_arm64) ..."
    # NB: the rustup cargo and rustc come first on PATH; the arm64 standard library exists only
    # for Debian's toolchain, so name it by full path. Debian's cargo gets a CARGO_HOME of its
    # own (its crates downloaded once, cached): a newer cargo holds the package cache's lock
    # for its whole build, and the test script's cargo, sharing ~/.cargo, waited for the
    # background arm64 build to end before it could start.
    env -u RUSTUP_TOOLCHAIN RUSTC=/usr/bin/rustc \
        CARGO_HOME="$SLUICE_CACHE/cargo-home-debian" \
        CARGO_TARGET_DIR="$SLUICE_CACHE/target-image-arm64" \
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
        AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
        /usr/bin/cargo build --locked --quiet --profile "$profile_arm64" --target aarch64-unknown-linux-gnu \
        "${pkgs[@]}" "${bins[@]}"
    arm64_bin="$SLUICE_CACHE/target-image-arm64/aarch64-unknown-linux-gnu/$(pdir "$profile_arm64")"
fi
log "binaries built in $((SECONDS - t0))s"
if [ -n "$bins_only" ]; then
    for arch in $arches; do binvar=${arch}_bin; echo "$arch ${!binvar}"; done
    exit 0
fi

# ---- images --------------------------------------------------------------------------------
B=(buildah --storage-driver vfs --root "$work/storage" --runroot "$work/run")
list="localhost/sluice:$version"
"${B[@]}" manifest create "$list" >/dev/null
mkdir -p "$out"
sizes="$out/sluice-$version-SIZES.txt"
: >"$sizes"
for arch in $arches; do
    binvar=${arch}_bin
    profvar=profile_${arch}
    rootfs="$work/rootfs-$arch"
    scripts/images/image-rootfs.sh "$arch" "${!binvar}" "$rootfs"
    c=$("${B[@]}" from --arch "$arch" --os linux scratch)
    "${B[@]}" copy "$c" "$rootfs/" / >/dev/null
    "${B[@]}" config --arch "$arch" --os linux \
        --user 65532:65532 --workingdir / --env PATH=/usr/local/bin \
        --entrypoint '["/usr/local/bin/sluice-dataplane"]' \
        --port 9080 --port 9443 --port 9091 --port 18000 --port 9092 \
        --label org.opencontainers.image.title=sluice \
        --label "org.opencontainers.image.version=$version" \
        --label "io.sluice.cargo-profile=${!profvar}" \
        --label org.opencontainers.image.licenses=Apache-2.0 \
        --label "org.opencontainers.image.description=Sluice ingress controller: sluice-controller and sluice-dataplane" \
        "$c"
    "${B[@]}" commit --quiet --format oci --rm "$c" "localhost/sluice:$version-$arch" >/dev/null
    "${B[@]}" manifest add --arch "$arch" --os linux "$list" "containers-storage:localhost/sluice:$version-$arch" >/dev/null
    unpacked=$(du -sb "$rootfs" | cut -f1)
    printf 'linux/%s  (cargo profile %s)  unpacked %s MiB\n' "$arch" "${!profvar}" "$(awk -v b="$unpacked" 'BEGIN{printf "%.1f", b/1048576}')" >>"$sizes"
done
archive="$out/sluice-$version.oci.tar"
rm -f "$archive"
"${B[@]}" manifest push --quiet --all --format oci "$list" "oci-archive:$archive:sluice:$version"

# Compressed (registry) size per architecture: the layer blobs of each manifest.
mkdir -p "$work/x"
tar -xf "$archive" -C "$work/x"
python3 - "$work/x" "$sizes" <<'PY'
import json, sys, os
d, sizes = sys.argv[1], sys.argv[2]
blob = lambda dg: os.path.join(d, "blobs", *dg.split(":"))
top = json.load(open(os.path.join(d, "index.json")))
idx = json.load(open(blob(top["manifests"][0]["digest"])))
lines = open(sizes).read().splitlines()
out = []
for m in idx["manifests"]:
    arch = m["platform"]["architecture"]
    man = json.load(open(blob(m["digest"])))
    comp = sum(l["size"] for l in man["layers"])
    for l in lines:
        if l.startswith(f"linux/{arch} "):
            out.append(f"{l}, compressed {comp / 1048576:.1f} MiB, manifest {m['digest'][:19]}")
open(sizes, "w").write("\n".join(out) + "\n")
PY
log "wrote $archive ($(du -h "$archive" | cut -f1)), index of: $arches"
cat "$sizes" >&2
log "check it with: scripts/images/check-images.sh $archive"
