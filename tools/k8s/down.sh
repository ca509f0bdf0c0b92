#!/usr/bin/env bash
# Removes everything tools/k8s/up.sh started: the port-forward, every container and pod sandbox,
# the node's and the control plane's processes (by the PIDs up.sh recorded), kube-proxy's iptables
# rules, the mounts under .baton/k8s (container filesystems, volumes, network namespaces), the
# bridge, the sysctls and the /etc/hosts entry it changed, and the state folder. Logs of the last
# cluster stay in .baton/k8s-logs.
#
#   tools/k8s/down.sh      (make k8s-down)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

[[ -d "$STATE" ]] || { echo "nothing to stop"; exit 0; }

stop_pid() {  # stop_pid <name>: TERM, wait up to 10 s, then KILL
    local file="$STATE/pids/$1.pid" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$file"
}

SOCK="$STATE/containerd/containerd.sock"
stop_pid port-forward
stop_pid kubelet
# The containers outlive the kubelet; stop them through containerd, which still runs.
if [[ -S "$SOCK" ]]; then
    for task in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr --address "$SOCK" -n k8s.io tasks kill -s KILL "$task" >/dev/null 2>&1
    done
    sleep 1
    for task in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
        ctr --address "$SOCK" -n k8s.io tasks delete -f "$task" >/dev/null 2>&1
    done
fi
stop_pid coredns
stop_pid kube-proxy
stop_pid containerd
# containerd's shims are their own processes; they are found by the socket path up.sh gave them.
for pid in $(pgrep -f -- "-address $SOCK" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
stop_pid metrics-server
stop_pid kube-scheduler
stop_pid kube-controller-manager
stop_pid kube-apiserver
stop_pid etcd
# Whatever else up.sh recorded, so a process added there is never left behind.
for file in "$STATE"/pids/*.pid; do
    [[ -f "$file" ]] && stop_pid "$(basename "$file" .pid)"
done

if [[ -x "$BIN/kube-proxy" ]]; then "$BIN/kube-proxy" --cleanup >/dev/null 2>&1; fi
# What kube-proxy's cleanup leaves: the kubelet's own chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY, ...).
for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle; do
        "$cmd" -t "$table" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | sed 's/^-A /-D /' |
            while read -r rule; do eval "$cmd -t $table $rule"; done
        chains="$("$cmd" -t "$table" -S 2>/dev/null | awk '/^-N KUBE-/ {print $2}')"
        for chain in $chains; do "$cmd" -t "$table" -F "$chain"; done
        for chain in $chains; do "$cmd" -t "$table" -X "$chain"; done
    done
done

# Deepest first: container root filesystems, volume mounts, network namespaces.
findmnt -rn -o TARGET | grep -F "$STATE/" | sort -r | while read -r target; do
    umount "$target" 2>/dev/null || umount -l "$target"
done

if [[ -f "$STATE/bridge-created" ]]; then ip link delete "$BRIDGE" 2>/dev/null; fi
if [[ -f "$STATE/sysctl.saved" ]]; then
    while IFS= read -r line; do sysctl -qw "$line"; done <"$STATE/sysctl.saved"
fi
if [[ -f "$STATE/added-hosts-entry" ]]; then
    # Rewritten in place: /etc/hosts may be a bind mount, which a rename (sed -i) cannot replace.
    hosts="$(grep -vxF "127.0.0.1 $NODE_NAME" /etc/hosts)"
    printf '%s\n' "$hosts" >/etc/hosts
fi

rm -rf "$ROOT/.baton/k8s-logs"
mv "$STATE/logs" "$ROOT/.baton/k8s-logs" 2>/dev/null
rm -rf "$STATE"

# What must be gone now; anything left fails the command (and `make k8s-test`).
left=()
pgrep -f -- "$BIN/" >/dev/null 2>&1 && left+=("processes: $(pgrep -f -- "$BIN/" | tr '\n' ' ')")
pgrep -f -- "$STATE/" >/dev/null 2>&1 && left+=("processes: $(pgrep -f -- "$STATE/" | tr '\n' ' ')")
findmnt -rn -o TARGET | grep -qF "$STATE" && left+=("mounts under $STATE")
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
ss -Hltn "sport = :$GATEWAY_PORT" 2>/dev/null | grep -q . && left+=("a listener on $GATEWAY_PORT")
if ((${#left[@]})); then
    log "left behind: ${left[*]}"
    exit 1
fi
echo "k8s: down (logs of the last cluster in .baton/k8s-logs)"
