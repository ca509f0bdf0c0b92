#!/usr/bin/env bash
# Builds the pinned Kubernetes binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy), CoreDNS and metrics-server from their Go modules into ~/.cache/baton/k8s/bin,
# and prints that folder.
# The build is cached: a stamp records what was built, and Go's build cache makes a rebuild after a
# version change incremental.
#
#   tools/k8s/build.sh
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
module_version() {  # module_version <go.mod> <module>: the version that go.mod requires
    awk -v m="$2" '{ for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/ && $(i - 1) != "=>") print $(i + 1) }' "$1" | head -1
}
KUBE_VERSION="$(module_version "$HERE/kube/go.mod" k8s.io/kubernetes)"
COREDNS_VERSION="$(module_version "$HERE/coredns/go.mod" github.com/coredns/coredns)"
METRICS_VERSION="$(module_version "$HERE/metrics-server/go.mod" sigs.k8s.io/metrics-server)"
COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# One stamp per module: what was built from which sources.
kube_stamp="kubernetes $KUBE_VERSION $(cat "$HERE/kube/go.mod" "$HERE/kube/go.sum" "$HERE/kube/tools.go" | sha256sum | cut -c1-16)"
coredns_stamp="coredns $COREDNS_VERSION $(cat "$HERE/coredns/go.mod" "$HERE/coredns/go.sum" "$HERE/coredns/main.go" | sha256sum | cut -c1-16)"
metrics_stamp="metrics-server $METRICS_VERSION $(cat "$HERE/metrics-server/go.mod" "$HERE/metrics-server/go.sum" | sha256sum | cut -c1-16)"
built() { [[ -f "$BIN/.stamp-$1" && "$(cat "$BIN/.stamp-$1")" == "$2" ]]; }

if built kube "$kube_stamp" && built coredns "$coredns_stamp" && built metrics "$metrics_stamp"; then
    echo "$BIN"
    exit 0
fi
if ! command -v go >/dev/null 2>&1; then
    for candidate in /usr/local/go/bin/go /usr/lib/go/bin/go; do
        if [[ -x "$candidate" ]]; then PATH="$(dirname "$candidate"):$PATH"; break; fi
    done
fi
command -v go >/dev/null 2>&1 || { echo "tools/k8s/build.sh: a Go toolchain is needed" >&2; exit 1; }

mkdir -p "$BIN"
exec 9>"$BIN/.lock"
flock 9

minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
# kubectl and Helm compare the server's version; an unstamped build reports v0.0.0-master.
version_flags="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
if ! built kube "$kube_stamp"; then
    for command in "${COMMANDS[@]}"; do
        echo "tools/k8s/build.sh: building $command $KUBE_VERSION" >&2
        (cd "$HERE/kube" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $version_flags" \
            -o "$BIN/$command" "k8s.io/kubernetes/cmd/$command")
    done
    echo "$kube_stamp" >"$BIN/.stamp-kube"
fi
if ! built coredns "$coredns_stamp"; then
    echo "tools/k8s/build.sh: building coredns $COREDNS_VERSION" >&2
    (cd "$HERE/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/coredns" baton.local/coredns)
    echo "$coredns_stamp" >"$BIN/.stamp-coredns"
fi
if ! built metrics "$metrics_stamp"; then
    echo "tools/k8s/build.sh: building metrics-server $METRICS_VERSION" >&2
    (cd "$HERE/metrics-server" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$BIN/metrics-server" \
        sigs.k8s.io/metrics-server/cmd/metrics-server)
    echo "$metrics_stamp" >"$BIN/.stamp-metrics"
fi
echo "$BIN"
