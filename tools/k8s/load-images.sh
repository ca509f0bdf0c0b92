#!/usr/bin/env bash
# Puts the images `make images` built (and the pod sandbox's pause image) into the node's containerd.
# Exported archives are kept in ~/.cache/baton/k8s/images by image id, so an unchanged image is not exported again.
#
#   tools/k8s/load-images.sh <containerd socket>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SOCK="$1"
TAG="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/baton/Chart.yaml")"
IMAGES=(ghcr.io/baton-llm/baton ghcr.io/baton-llm/baton-kafka ghcr.io/baton-llm/baton-standin ghcr.io/baton-llm/baton-trainer)
PAUSE=localhost/baton-pause:1
mkdir -p "$CACHE/images"

if ! buildah inspect --type image "$PAUSE" >/dev/null 2>&1; then
    work="$(mktemp -d)"
    gcc -static -Os -s -o "$work/pause" "$HERE/pause.c"
    container="$(buildah from scratch)"
    buildah copy --quiet "$container" "$work/pause" /pause >/dev/null
    buildah config --entrypoint '["/pause"]' --user 65535:65535 "$container"
    buildah commit --quiet --rm "$container" "$PAUSE" >/dev/null
    rm -rf "$work"
fi

for ref in "${IMAGES[@]/%/:$TAG}" "$PAUSE"; do
    id="$(buildah inspect --type image --format '{{.FromImageID}}' "$ref" 2>/dev/null)" \
        || { log "image $ref is missing: run 'make images'"; exit 1; }
    archive="$CACHE/images/$(echo "$ref" | tr '/:' '__').tar"
    if [[ ! -f "$archive" || "$(cat "$archive.id" 2>/dev/null)" != "$id" ]]; then
        rm -f "$archive"
        buildah push --quiet "$ref" "docker-archive:$archive:$ref" >/dev/null
        echo "$id" >"$archive.id"
    fi
    ctr --address "$SOCK" -n k8s.io images import "$archive" >/dev/null
done
