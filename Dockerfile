# syntax=docker/dockerfile:1
# praxis-serve image. The build stage runs the project's own setup and build on a CUDA development
# base; the runtime stage holds only the server, the clients and the libraries they load, on the
# matching CUDA runtime base. Both bases are build arguments: the test builds this file on a Debian
# bookworm base made offline (deploy/podman/make-base.sh); docs/deploy.md has the production build.
ARG BUILD_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Setup first, in its own layer: source edits do not re-install packages or torch.
COPY scripts/setup.sh scripts/setup.sh
RUN bash scripts/setup.sh --build-only
COPY . .
# Only what the image ships is built; the build tree goes in the same layer as it came. ccache
# (installed by setup) is reused when the cache is mounted: -v ~/.cache/ccache:/root/.cache/ccache.
RUN bash scripts/build.sh praxis-server praxis-cli praxis-load \
 && bash scripts/bundle.sh /opt/praxis \
 && rm -rf build

FROM ${RUNTIME_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /opt/praxis /opt/praxis
# A numeric non-root user, so Kubernetes' runAsNonRoot can verify it.
RUN echo /opt/praxis/lib > /etc/ld.so.conf.d/praxis.conf \
 && ldconfig \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin praxis
ENV PATH=/opt/praxis/bin:${PATH}
USER 10001:10001
# gRPC (Praxis, health, reflection) and Prometheus /metrics: the server's defaults.
EXPOSE 50051 9090
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["praxis-cli", "health", "--address=127.0.0.1:50051", "--timeout=4s"]
ENTRYPOINT ["praxis-server"]
