# syntax=docker/dockerfile:1
# Multi-arch image of Sluice (both binaries), cross-compiled on the build machine:
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/sluice:TAG --push .
#
# Keep in step with scripts/images/build-images.sh (the daemonless build used in this repository):
# same binaries, same runtime layout (scripts/images/image-rootfs.sh), same user.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---- build: runs on the build machine's platform and cross-compiles for TARGETARCH ----
FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
ARG TARGETARCH
ARG BUILDARCH
# Cargo profile of the shipped binaries (dist: optimised, thin LTO, stripped; see Cargo.toml).
ARG PROFILE=dist
RUN set -eux; \
    case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-gnu; gccpkg=gcc-x86-64-linux-gnu; libc=libc6-dev-amd64-cross ;; \
      arm64) triple=aarch64-unknown-linux-gnu; gccpkg=gcc-aarch64-linux-gnu; libc=libc6-dev-arm64-cross ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac; \
    apt-get update; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      apt-get install -y --no-install-recommends "$gccpkg" "$libc"; \
    fi; \
    apt-get install -y --no-install-recommends binutils ca-certificates; \
    rm -rf /var/lib/apt/lists/*; \
    rustup target add "$triple"; \
    echo "$triple" > /triple
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=sluice-target-$TARGETARCH \
    set -eux; \
    triple=$(cat /triple); \
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
           CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
           CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
           CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc; \
    if [ "$TARGETARCH" = "$BUILDARCH" ]; then \
      unset CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER CC_aarch64_unknown_linux_gnu \
            CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER CC_x86_64_unknown_linux_gnu; \
    fi; \
    cargo build --locked --profile "$PROFILE" --target "$triple" \
      -p sluice-controller -p sluice-dataplane \
      --bin sluice-controller --bin sluice-dataplane; \
    dir=$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE"); \
    mkdir -p /out/bin; \
    cp "target/$triple/$dir/sluice-controller" "target/$triple/$dir/sluice-dataplane" /out/bin/; \
    scripts/images/image-rootfs.sh "$TARGETARCH" /out/bin /out/rootfs

# ---- runtime: nothing but the binaries, their libraries and a non-root user ----
FROM scratch
COPY --from=build /out/rootfs/ /
USER 65532:65532
ENV PATH=/usr/local/bin
EXPOSE 9080 9443 9091 18000 9092
# The chart picks the binary with `command:`; the dataplane is the default.
ENTRYPOINT ["/usr/local/bin/sluice-dataplane"]
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Sluice ingress controller: sluice-controller and sluice-dataplane" \
      org.opencontainers.image.licenses="Apache-2.0"
