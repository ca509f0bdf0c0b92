# syntax=docker/dockerfile:1.7
# The trainer batch job: reads the episode dataset, trains a candidate policy and publishes it when
# it beats the current one. Torch comes from PyPI (its Linux wheels carry CUDA), so the same image
# trains the CPU policy or, with a GPU, the LLM conductor's LoRA adapter.
#
#   docker build -f docker/trainer.Dockerfile -t baton-trainer:dev .
#
# Pin the base image by digest for production builds: --build-arg PYTHON_IMAGE=<tag>@sha256:<digest>.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8
FROM ${UV_IMAGE} AS uv

FROM ${PYTHON_IMAGE} AS build
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3 \
    UV_PROJECT_ENVIRONMENT=/opt/baton/venv
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable --package baton-trainer

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="baton-trainer" \
      org.opencontainers.image.description="Baton's offline trainer (CronJob)"
RUN groupadd --system --gid 10001 baton \
    && useradd --system --uid 10001 --gid baton --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin baton
COPY --from=build /opt/baton/venv /opt/baton/venv
ENV PATH=/opt/baton/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
WORKDIR /tmp
CMD ["baton-trainer"]
