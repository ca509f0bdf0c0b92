#!/usr/bin/env bash
# Builds Baton's container images with a Docker engine (BuildKit) or, where there is none, with
# buildah (no daemon) on base images made from Debian's archive by docker/local/bases.sh, so no
# registry is needed either. The Dockerfiles are the same for both.
#
#   docker/build.sh                      # every image, tagged with the version in the chart
#   REGISTRY=ghcr.io/acme TAG=0.1.0 PUSH=1 docker/build.sh
#   docker/build.sh services router-gpu  # only some images
#   BUILDER=buildah docker/build.sh      # force the daemonless path (the default without docker)
#
# Images:
#   services    baton             gateway, router (CPU), synthesizer, executor, reward logger, topics CLI
#   router-cpu  baton-router-cpu  the services image plus the router's `transformers` extra (CPU conductor);
#                                 built only once services/router/pyproject.toml declares that extra
#   router-gpu  baton-router-gpu  vLLM's image with baton-router installed (in-process vLLM conductor)
#   trainer     baton-trainer     the trainer CronJob; built only once services/trainer exists
#   kafka       baton-kafka       a single-node Kafka broker from Maven Central's jars (clusters without Kafka)
#   standin     baton-standin     the provider stand-ins (OpenAI, Anthropic, Gemini wire formats), for tests
#
# The buildah path skips router-gpu: it builds on vLLM's CUDA image, which only a registry serves.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DOCKER="${DOCKER:-docker}"
if [[ -z "${BUILDER:-}" ]]; then
    # A docker client without a reachable engine counts as none.
    if command -v "$DOCKER" >/dev/null && "$DOCKER" info >/dev/null 2>&1; then BUILDER=docker; else BUILDER=buildah; fi
fi
REGISTRY="${REGISTRY:-ghcr.io/baton-llm}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/baton/Chart.yaml)}"
PUSH="${PUSH:-0}"
PLATFORM="${PLATFORM:-linux/amd64}"

BASE_ARGS=()
if [[ "$BUILDER" == docker ]]; then
    command -v "$DOCKER" >/dev/null || { echo "docker/build.sh: no '$DOCKER' command" >&2; exit 1; }
else
    command -v buildah >/dev/null || { echo "docker/build.sh: neither docker nor buildah; run tools/k8s/packages.sh" >&2; exit 1; }
    mapfile -t BASE_ARGS < <(docker/local/bases.sh)
fi

has_router_extra() { grep -Eq '^\s*transformers\s*=' services/router/pyproject.toml; }

build() {  # build <name> <dockerfile> [build args...]; CONTEXT (default .) is the build context
    local name="$1" file="$2"
    shift 2
    local ref="$REGISTRY/$name:$TAG"
    echo "==> $ref ($file)"
    if [[ "$BUILDER" == docker ]]; then
        DOCKER_BUILDKIT=1 "$DOCKER" build --platform "$PLATFORM" -f "$file" -t "$ref" "$@" "${CONTEXT:-.}"
        if [[ "$PUSH" == 1 ]]; then "$DOCKER" push "$ref"; fi
    else
        # Docker format keeps SHELL (OCI has no field for it); chroot isolation needs no daemon and no user namespaces; --layers reuses unchanged steps.
        # Package downloads inside RUN trust the machine's CA bundle (a TLS-inspecting proxy signs
        # with a local CA), and uv is told to use it (docker/local/uv.toml); neither stays in the image.
        buildah bud --quiet --format docker --isolation chroot --layers --pull-never --platform "$PLATFORM" \
            -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
            -v "$ROOT/docker/local/uv.toml:/etc/uv/uv.toml:ro" \
            "${BASE_ARGS[@]}" -f "$file" -t "$ref" "$@" "${CONTEXT:-.}" >/dev/null
        if [[ "$PUSH" == 1 ]]; then buildah push "$ref"; fi
        # Every change to the sources makes a new build stage (a venv, about 1 GB) and leaves the
        # image the tag pointed to untagged. Kept, they filled a CI machine's disk within a day of
        # builds, until the local cluster's kubelet evicted its own pause image. Untagged images
        # go; the tagged ones, and the layers they use, stay.
        buildah rmi --prune >/dev/null 2>&1 || true
    fi
}

kafka_context() {  # a build context with the broker's jars (cached by baton_tools.kafka)
    local context="$ROOT/.baton/images/kafka-context"
    local libs
    libs="$("$ROOT/.venv/bin/python" -m baton_tools.kafka fetch 2>/dev/null | tail -1)"
    rm -rf "$context"
    mkdir -p "$context"
    cp -r "$libs" "$context/libs"
    cp docker/kafka/log4j2.properties docker/kafka/kafka-start.sh "$context/"
    echo "$context"
}

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=(services router-cpu router-gpu trainer kafka standin); fi

for target in "${targets[@]}"; do
    case "$target" in
        services)
            build baton docker/services.Dockerfile ;;
        router-cpu)
            if has_router_extra; then
                build baton-router-cpu docker/services.Dockerfile \
                    --build-arg PACKAGES=baton-router --build-arg UV_EXTRA_ARGS="--extra transformers"
            else
                echo "==> skipping router-cpu: services/router/pyproject.toml has no 'transformers' extra yet"
            fi ;;
        router-gpu)
            if [[ "$BUILDER" == docker ]]; then
                build baton-router-gpu docker/router-gpu.Dockerfile
            else
                echo "==> skipping router-gpu: its base is vLLM's CUDA image, which needs a registry"
            fi ;;
        trainer)
            if [[ -f services/trainer/pyproject.toml ]]; then
                build baton-trainer docker/trainer.Dockerfile
            else
                echo "==> skipping trainer: services/trainer is not in the workspace yet"
            fi ;;
        kafka)
            CONTEXT="$(kafka_context)" build baton-kafka docker/kafka.Dockerfile ;;
        standin)
            build baton-standin docker/services.Dockerfile --build-arg PACKAGES=baton-tools --build-arg UV_EXTRA_ARGS="" ;;
        *)
            echo "docker/build.sh: unknown image '$target' (services, router-cpu, router-gpu, trainer, kafka, standin)" >&2
            exit 2 ;;
    esac
done
