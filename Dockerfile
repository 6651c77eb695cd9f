# syntax=docker/dockerfile:1
#
# The agentrun image: the `agentrun` binary (controller, worker, crdgen, local runs) and the
# `kubectl-agentrun` kubectl plugin, on a minimal non-root runtime base. The workspace's other
# members (crates/: the dev kubelet, the test kit, the benchmark) are dev tools, not built here.
#
#   docker build -t ghcr.io/agentrun-dev/agentrun:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION=$(git rev-parse HEAD) .
#
# The chart (charts/agentrun) runs this image as the controller and as the default worker image.
# scripts/image builds the equivalent image without a Docker engine (umoci): the same static musl
# build of both binaries, the same user (65532) and entrypoint, Debian's CA certificates; this file
# puts them on distroless/static (which adds tzdata, /tmp and /home/nonroot). docs/real-node.md.

ARG RUST_VERSION=1

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# The whole source tree (see .dockerignore; cargo needs every workspace member's manifest);
# --locked builds exactly the versions of Cargo.lock.
COPY . .
# Static binaries (musl), as scripts/image builds them: the runtime base needs no libc.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
# The cache mounts keep the registry and the target folder between builds (BuildKit), so the
# binaries are copied out of the cached target folder in the same step. `-p agentrun --bins` builds
# the root package's two binary targets only: agentrun (src/main.rs) and the kubectl plugin
# kubectl-agentrun (src/bin/).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    set -eu; \
    cargo build --release --locked -p agentrun --bins --target x86_64-unknown-linux-musl; \
    mkdir -p /out; \
    cp target/x86_64-unknown-linux-musl/release/agentrun \
       target/x86_64-unknown-linux-musl/release/kubectl-agentrun /out/; \
    /out/agentrun --version

# CA certificates, tzdata, /etc/passwd with nonroot; no libc, no shell, no package manager; user
# nonroot (65532).
FROM gcr.io/distroless/static-debian12:nonroot

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="agentrun" \
      org.opencontainers.image.description="A Kubernetes operator for AI-agent runs that pause for human approval of risky tool calls and resume later, with an audit trail." \
      org.opencontainers.image.source="https://github.com/agentrun-dev/agentrun" \
      org.opencontainers.image.url="https://github.com/agentrun-dev/agentrun" \
      org.opencontainers.image.documentation="https://github.com/agentrun-dev/agentrun/tree/main/charts/agentrun" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="agentrun" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="gcr.io/distroless/static-debian12:nonroot"

COPY --from=builder --chown=0:0 --chmod=0755 /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["agentrun"]
CMD ["--help"]
