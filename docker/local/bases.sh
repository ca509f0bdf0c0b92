#!/usr/bin/env bash
# Base images made from Debian's archive, for building docker/*.Dockerfile where no container
# registry is reachable. Prints build arguments, one `--build-arg NAME=REF` a line, that point the
# Dockerfiles' base-image arguments at them:
#
#   PYTHON_IMAGE  Debian's Python 3.11 (minbase + python3), with python3 at /usr/local/bin as in
#                 the official python images the Dockerfiles name by default
#   UV_IMAGE      the pinned uv binary at /uv, as in ghcr.io/astral-sh/uv
#   JRE_IMAGE     Debian's OpenJDK 17 runtime, for the Kafka image
#
# Each image's tag carries a hash of its recipe, so a second call reuses it and a changed recipe
# builds anew.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SUITE="${DEBIAN_SUITE:-bookworm}"
UV_BIN="$ROOT/.tools/uv/bin/uv"
# Documentation, manuals and translations are not needed in a container.
EXCLUDES=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
          --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*')

# Bump when the way images are made changes; the tags below change with it.
RECIPE_REVISION=1
recipe_tag() {  # recipe_tag <recipe...>: a short hash of an image's recipe
    printf '%s\n' "$RECIPE_REVISION" "$SUITE" "${EXCLUDES[@]}" "$@" | sha256sum | cut -c1-12
}

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }

debian_image() {  # debian_image <ref> <packages,comma,separated> [customize hooks...]
    local ref="$1" packages="$2"
    shift 2
    have_image "$ref" && return 0
    local work
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' RETURN
    echo "docker/local/bases.sh: $ref from Debian $SUITE ($packages)" >&2
    local hooks=(--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*')
    for hook in "$@"; do hooks+=(--customize-hook="$hook"); done
    # openjdk's post-install links its manual page and fails when man1 is missing (manuals are excluded).
    mmdebstrap --quiet --variant=minbase --essential-hook='mkdir -p "$1/usr/share/man/man1"'  --include="$packages" "${EXCLUDES[@]}" "${hooks[@]}" \
        "$SUITE" "$work/rootfs.tar" >&2
    local container
    container="$(buildah from scratch)"
    buildah add --quiet "$container" "$work/rootfs.tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash --label "org.opencontainers.image.base.name=debian:$SUITE" "$container"
    buildah commit --quiet --rm "$container" "$ref" >/dev/null
}

PYTHON_RECIPE=(python3,ca-certificates,passwd
               'ln -s /usr/bin/python3 "$1/usr/local/bin/python3"; ln -s /usr/bin/python3 "$1/usr/local/bin/python"')
python_ref="localhost/baton-base-python:$SUITE-$(recipe_tag "${PYTHON_RECIPE[@]}")"
debian_image "$python_ref" "${PYTHON_RECIPE[@]}"

JRE_RECIPE=(openjdk-17-jre-headless,ca-certificates,passwd)
jre_ref="localhost/baton-base-jre:$SUITE-$(recipe_tag "${JRE_RECIPE[@]}")"
debian_image "$jre_ref" "${JRE_RECIPE[@]}"

[[ -x "$UV_BIN" ]] || { echo "docker/local/bases.sh: $UV_BIN is missing; run 'make install' first" >&2; exit 1; }
uv_version="$("$UV_BIN" --version | awk '{print $2}')"
uv_ref="localhost/baton-base-uv:$uv_version"
if ! have_image "$uv_ref"; then
    container="$(buildah from scratch)"
    buildah copy --quiet "$container" "$UV_BIN" /uv >/dev/null
    buildah commit --quiet --rm "$container" "$uv_ref" >/dev/null
fi

echo "--build-arg=PYTHON_IMAGE=$python_ref"
echo "--build-arg=UV_IMAGE=$uv_ref"
echo "--build-arg=JRE_IMAGE=$jre_ref"
