# syntax=docker/dockerfile:1.7
# The image of Baton's Python services: gateway, router (CPU backends), synthesizer, executor and
# reward logger, plus the `baton` CLI's topic creation. The chart picks the service by command.
#
# Build from the repository root (docker/build.sh does):
#   docker build -f docker/services.Dockerfile -t baton:dev .
#
# Base images are pinned by tag. For reproducible production builds pin them by digest too, e.g.
#   --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>
# (`docker buildx imagetools inspect python:3.11.14-slim-bookworm` prints the digest).

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# uv itself, pinned to the version the Makefile uses, so the lock is read the same way everywhere.
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8
FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
# Compile bytecode now: the root filesystem is read-only at run time.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3 \
    UV_PROJECT_ENVIRONMENT=/opt/baton/venv
# Workspace members installed into the venv. Narrow it to build a one-service image, or choose the
# extras with UV_EXTRA_ARGS: the default carries the router's `policy` backend (the trained routing
# policy, CPU only); "--extra transformers" gives the CPU conductor.
ARG PACKAGES="baton-gateway baton-router baton-synthesizer baton-executor baton-reward-logger baton-console"
ARG UV_EXTRA_ARGS="--extra policy"
WORKDIR /src
COPY . .
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# --locked: the build fails instead of resolving anew when uv.lock is stale.
# --no-editable: the venv holds copies of the members, so the sources can stay behind.
RUN --mount=type=cache,target=/root/.cache/uv \
    read -r -a packages <<< "$PACKAGES" \
    && read -r -a extra <<< "$UV_EXTRA_ARGS" \
    && uv sync --locked --no-dev --no-editable "${packages[@]/#/--package=}" "${extra[@]}"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="baton" \
      org.opencontainers.image.description="Baton services: gateway, router, synthesizer, executor, reward logger"
RUN groupadd --system --gid 10001 baton \
    && useradd --system --uid 10001 --gid baton --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin baton
# Only the venv: no uv, no sources, no build caches. Owned by root so the service cannot change it.
COPY --from=build /opt/baton/venv /opt/baton/venv
ENV PATH=/opt/baton/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
# gateway (API, metrics), router, synthesizer, executor, reward logger
EXPOSE 8080 9100 9101 9102 9103 9104
# Kubernetes probes /health/live and /health/ready; no HEALTHCHECK is needed there.
CMD ["baton-gateway"]
