#!/usr/bin/env bash
# Assembles the runtime root filesystem of the Sluice image for one architecture: both
# binaries, the glibc loader and the shared libraries they need, CA certificates and a
# non-root user (uid/gid 65532, "nonroot"). Used by the Dockerfile's build stage and by
# scripts/images/build-images.sh, so both produce the same layout:
#
#   /usr/local/bin/sluice-controller
#   /usr/local/bin/sluice-dataplane
#   /lib/<multiarch>/lib*.so*, the loader at its ELF interpreter path
#   /etc/passwd, /etc/group, /etc/nsswitch.conf, /etc/ssl/certs/ca-certificates.crt
#   /tmp (empty; mount an emptyDir there if the root filesystem is read-only)
#
#   scripts/images/image-rootfs.sh ARCH BIN_DIR OUT_DIR
#     ARCH     amd64 or arm64
#     BIN_DIR  directory holding sluice-controller and sluice-dataplane for ARCH
#     OUT_DIR  created (must not exist)
#   SLUICE_ROOTFS_BINS="a b" takes other binaries from BIN_DIR instead of the two (the test
#   backend image of the real-node e2e tests holds sluice-echo this way).
#
# Libraries come from the build machine: the native ones for the build machine's own
# architecture; for the other one, Debian's multiarch libc (libc6:arm64 under
# /lib/<triple>, which Debian's security updates reach, and which the arm64 Rust build
# installs anyway) first, then the cross packages (libc6-dev-arm64-cross /
# libc6-dev-amd64-cross, under /usr/<triple>/lib). NB: bookworm's cross libc (2.36-8cross1)
# lags behind; under qemu-user 7.2 on this kernel its pthread_create never returns, while
# libc6:arm64 2.36-9+deb12u14 works. Needs readelf (binutils).
set -euo pipefail

die() { echo "image-rootfs: error: $*" >&2; exit 1; }

[ $# -eq 3 ] || die "usage: $0 ARCH BIN_DIR OUT_DIR"
arch=$1 bins=$2 out=$3
case $arch in
amd64) multiarch=x86_64-linux-gnu machine="X86-64" ;;
arm64) multiarch=aarch64-linux-gnu machine="AArch64" ;;
*) die "unknown ARCH $arch (amd64 or arm64)" ;;
esac
command -v readelf >/dev/null || die "readelf is missing (apt-get install binutils)"
[ ! -e "$out" ] || die "$out already exists"

host_multiarch=$(gcc -dumpmachine 2>/dev/null || uname -m)
case $host_multiarch in x86_64*) host_multiarch=x86_64-linux-gnu ;; aarch64*) host_multiarch=aarch64-linux-gnu ;; esac
if [ "$host_multiarch" = "$multiarch" ]; then
    libdirs=("/lib/$multiarch" "/usr/lib/$multiarch" /lib64 /lib)
else
    libdirs=("/lib/$multiarch" "/usr/lib/$multiarch" "/usr/$multiarch/lib" "/usr/$multiarch/lib64")
fi

find_lib() {
    local d
    for d in "${libdirs[@]}"; do
        if [ -e "$d/$1" ]; then
            readlink -f "$d/$1"
            return
        fi
    done
    die "$1 (needed by the $arch binaries) not found in ${libdirs[*]}"
}

read -r -a wanted <<<"${SLUICE_ROOTFS_BINS:-sluice-controller sluice-dataplane}"
for bin in "${wanted[@]}"; do
    [ -x "$bins/$bin" ] || die "$bins/$bin is missing"
    readelf -hW "$bins/$bin" | grep -q "Machine:.*$machine" ||
        die "$bins/$bin is not an $arch ($machine) executable"
done

mkdir -p "$out/usr/local/bin" "$out/lib/$multiarch" "$out/etc/ssl/certs" "$out/tmp"
chmod 1777 "$out/tmp"
declare -A seen=()
queue=()
for bin in "${wanted[@]}"; do
    install -m 0755 "$bins/$bin" "$out/usr/local/bin/$bin"
    queue+=("$bins/$bin")
done
interp=
while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}
    queue=("${queue[@]:1}")
    i=$(readelf -lW "$f" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -z "$i" ] || interp=$i
    for lib in $(readelf -dW "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        [ -z "${seen[$lib]:-}" ] || continue
        seen[$lib]=1
        # NB: the loader is a NEEDED entry of libc too; it goes to its interpreter path only.
        case $lib in ld-linux*) continue ;; esac
        src=$(find_lib "$lib")
        install -m 0755 "$src" "$out/lib/$multiarch/$lib"
        queue+=("$src")
    done
done
[ -n "$interp" ] || die "the $arch binaries are not dynamically linked (no ELF interpreter)"
loader=$(basename "$interp")
mkdir -p "$out$(dirname "$interp")"
[ -e "$out$interp" ] || install -m 0755 "$(find_lib "$loader")" "$out$interp"

cat >"$out/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$out/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
echo "hosts: files dns" >"$out/etc/nsswitch.conf"
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
    install -m 0644 /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/ca-certificates.crt"
fi
# NB: fixed timestamps so two builds of the same binaries give the same layer.
find "$out" -exec touch -h -d @0 {} +
