# Shared settings of the local cluster scripts (sourced, not run).
# shellcheck shell=bash
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="$ROOT/.baton/k8s"
# Built binaries and exported images are kept per user, so a second checkout reuses them.
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/baton/k8s"
BIN="$CACHE/bin"
KUBECONFIG_FILE="$STATE/kubeconfig"
# The node's name; /etc/hosts maps it to 127.0.0.1, so the API server reaches the kubelet (logs, exec,
# port-forward) on loopback while the kubelet itself refuses a loopback node IP.
NODE_NAME="baton-node"
BRIDGE="batonk8s0"
POD_CIDR="10.244.0.0/24"
BRIDGE_IP="10.244.0.1"
SERVICE_CIDR="10.96.0.0/24"
KUBERNETES_SERVICE_IP="10.96.0.1"
GATEWAY_PORT="${BATON_K8S_GATEWAY_PORT:-8080}"
RELEASE="baton"
NAMESPACE="baton"
KAFKA_NAMESPACE="baton-kafka"
export KUBECONFIG="$KUBECONFIG_FILE"

# The pinned kubectl build.sh makes, never whatever kubectl the machine has.
kubectl() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
helm() { "$ROOT/.tools/bin/helm" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
log() { echo "k8s: $*" >&2; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for() {  # wait_for <seconds> <what> <command...>
    local limit="$1" what="$2"
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            log "timed out after ${limit}s waiting for $what"
            return 1
        fi
        sleep 0.5
    done
}
