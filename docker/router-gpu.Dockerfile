# syntax=docker/dockerfile:1.7
# The router with the in-process vLLM conductor, built on vLLM's official image.
#
#   docker build -f docker/router-gpu.Dockerfile -t baton-router-gpu:dev .
#
# vLLM pins its own torch (a CUDA build) and transformers, which cannot share a venv with the
# locked CPU stack of the other images. So baton-router is installed into the image's Python beside
# vLLM: packages vLLM already has keep vLLM's versions, every other dependency takes the version in
# uv.lock, and a conflict between the two fails the build instead of breaking vLLM at run time.
#
# Pin the base image by digest for production builds: --build-arg VLLM_IMAGE=<tag>@sha256:<digest>.

ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0

ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8
FROM ${UV_IMAGE} AS uv

FROM ${VLLM_IMAGE}
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_NO_CACHE=1
WORKDIR /src
COPY . .
# The workspace members baton-router needs, in dependency order; tests/images checks this list
# against the members' pyproject files.
ARG MEMBERS="libs/contracts libs/workflow libs/platform libs/conductor services/router"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN read -r -a members <<< "$MEMBERS" \
    && uv pip list --system --format freeze > /tmp/in-image.txt \
    && sed -e 's/[=@ ].*//' /tmp/in-image.txt | tr '[:upper:]_.' '[:lower:]--' > /tmp/in-image-names.txt \
    && uv export --locked --no-dev --no-emit-workspace --no-hashes --no-header --no-annotate \
       --package baton-router --output-file /tmp/locked.txt \
    && awk 'NR == FNR { have[$0] = 1; next } \
            /^[A-Za-z0-9]/ { name = tolower($1); sub(/[=<>!~;@ ].*/, "", name); gsub(/[_.]/, "-", name); \
                             if (!(name in have)) print }' \
       /tmp/in-image-names.txt /tmp/locked.txt > /tmp/locked-missing.txt \
    && uv pip install --system --break-system-packages --no-deps -r /tmp/locked-missing.txt \
    && uv pip install --system --break-system-packages --no-deps "${members[@]/#/./}" \
    && uv pip check --system \
    && rm -rf /src/* /tmp/*.txt
RUN groupadd --system --gid 10001 baton \
    && useradd --system --uid 10001 --gid baton --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin baton
# Caches that vLLM, Triton and Hugging Face write go under HOME unless the chart points them at the
# model volume; /tmp is an emptyDir there.
ENV HOME=/tmp \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 9101
# vLLM's image starts `vllm serve`; this image starts the router, which runs vLLM in process.
ENTRYPOINT []
CMD ["baton-router"]
