# syntax=docker/dockerfile:1
# runner-svc: the runner, built from the workspace root:
#   docker build -f deploy/docker/runner.Dockerfile -t arbor/runner-svc .
# Stage 1 compiles with the toolchain rust-toolchain.toml pins (rustup in the image installs it);
# protos compile with protox, so no protoc is needed. Stage 2 is a slim runtime, non-root.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p arbor-runner-svc --bin runner-svc \
    && install -D -m 0755 target/release/runner-svc /out/runner-svc

FROM debian:bookworm-slim AS runtime
# ca-certificates: the services may talk TLS to a mesh egress or a remote runner URL.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/arbor --create-home arbor \
    && mkdir -p /var/lib/arbor/data && chown -R arbor /var/lib/arbor
COPY --from=build /out/runner-svc /usr/local/bin/runner-svc
USER 10001
WORKDIR /var/lib/arbor
ENV ARBOR_LISTEN=0.0.0.0:50051 \
    ARBOR_METRICS_LISTEN=0.0.0.0:9464 \
    ARBOR_DATA_DIR=/var/lib/arbor/data \
    ARBOR_LOG_JSON=true
# gRPC (the service, grpc.health.v1, reflection) and Prometheus /metrics. Listening beyond
# loopback needs --tokens (ARBOR_TOKENS) or, for local experiments only, ARBOR_INSECURE=true.
EXPOSE 50051 9464
VOLUME ["/var/lib/arbor/data"]
ENTRYPOINT ["/usr/local/bin/runner-svc"]
CMD ["serve"]
