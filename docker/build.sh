#!/usr/bin/env bash
# Builds Baton's container images where a Docker engine (with BuildKit) exists.
#
#   docker/build.sh                      # every image, tagged with the version in the chart
#   REGISTRY=ghcr.io/acme TAG=0.1.0 PUSH=1 docker/build.sh
#   docker/build.sh services router-gpu  # only some images
#
# Images:
#   services    baton             gateway, router (CPU), synthesizer, executor, reward logger, topics CLI
#   router-cpu  baton-router-cpu  the services image plus the router's `transformers` extra (CPU conductor);
#                                 built only once services/router/pyproject.toml declares that extra
#   router-gpu  baton-router-gpu  vLLM's image with baton-router installed (in-process vLLM conductor)
#   trainer     baton-trainer     the trainer CronJob; built only once services/trainer exists
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DOCKER="${DOCKER:-docker}"
REGISTRY="${REGISTRY:-ghcr.io/baton-llm}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/baton/Chart.yaml)}"
PUSH="${PUSH:-0}"
PLATFORM="${PLATFORM:-linux/amd64}"

command -v "$DOCKER" >/dev/null || { echo "docker/build.sh: no '$DOCKER' command; images need a Docker engine" >&2; exit 1; }

has_router_extra() { grep -Eq '^\s*transformers\s*=' services/router/pyproject.toml; }

build() {  # build <name> <dockerfile> [build args...]
    local name="$1" file="$2"
    shift 2
    local ref="$REGISTRY/$name:$TAG"
    echo "==> $ref ($file)"
    DOCKER_BUILDKIT=1 "$DOCKER" build --platform "$PLATFORM" -f "$file" -t "$ref" "$@" .
    if [[ "$PUSH" == 1 ]]; then "$DOCKER" push "$ref"; fi
}

targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then targets=(services router-cpu router-gpu trainer); fi

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
            build baton-router-gpu docker/router-gpu.Dockerfile ;;
        trainer)
            if [[ -f services/trainer/pyproject.toml ]]; then
                build baton-trainer docker/trainer.Dockerfile
            else
                echo "==> skipping trainer: services/trainer is not in the workspace yet"
            fi ;;
        *)
            echo "docker/build.sh: unknown image '$target' (services, router-cpu, router-gpu, trainer)" >&2
            exit 2 ;;
    esac
done
