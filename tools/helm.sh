#!/usr/bin/env bash
# Installs the pinned Helm CLI into .tools/bin and prints its path.
#
# Helm is built from its Go module instead of downloading a release tarball: the module proxy is
# reachable from every machine this project runs on (developers and CI), release hosts are not.
# The build is cached: a second call only checks the version and prints the path.
#
#   tools/helm.sh            # builds if needed, prints /abs/path/.tools/bin/helm
#   HELM_VERSION=v3.x.y tools/helm.sh
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.19.5}"
# The Kubernetes version Helm assumes without a cluster (`helm template`, `helm lint`); Helm's own
# release build derives it from its client-go (v0.34 for v3.19), a plain `go install` leaves v1.20.
KUBE_MINOR="${HELM_KUBE_MINOR:-34}"
BUILD_ID="$HELM_VERSION k8s-1.$KUBE_MINOR"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="$ROOT/.tools/bin"
HELM="$BIN_DIR/helm"
STAMP="$BIN_DIR/.helm-version"

if [[ -x "$HELM" && -f "$STAMP" && "$(cat "$STAMP")" == "$BUILD_ID" ]]; then
    echo "$HELM"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    for candidate in /usr/local/go/bin/go /usr/lib/go/bin/go; do
        if [[ -x "$candidate" ]]; then PATH="$(dirname "$candidate"):$PATH"; break; fi
    done
fi
command -v go >/dev/null 2>&1 || { echo "tools/helm.sh: a Go toolchain is needed to build Helm" >&2; exit 1; }

mkdir -p "$BIN_DIR"
# Concurrent callers (parallel test workers) must not build twice into the same file.
exec 9>"$BIN_DIR/.helm.lock"
flock 9
if [[ -x "$HELM" && -f "$STAMP" && "$(cat "$STAMP")" == "$BUILD_ID" ]]; then
    echo "$HELM"
    exit 0
fi

echo "tools/helm.sh: building helm $HELM_VERSION from its Go module (a few minutes the first time)" >&2
# The version string Helm reports comes from a linker flag; without it `helm version` says v3.x-dev.
GOBIN="$BIN_DIR" CGO_ENABLED=0 go install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
        -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$KUBE_MINOR \
        -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$KUBE_MINOR" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
echo "$BUILD_ID" >"$STAMP"
echo "$HELM"
