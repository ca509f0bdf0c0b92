#!/usr/bin/env bash
# Starts a single-node Kubernetes cluster on this machine and installs Baton on it.
#
#   tools/k8s/up.sh      (make k8s-up)
#
# Control plane: etcd (Debian), kube-apiserver, kube-controller-manager, kube-scheduler, all on
# loopback. Node: kubelet with containerd and runc (Debian), pods on a bridge this script creates
# (10.244.0.0/24, CNI bridge + host-local from Debian). Services: kube-proxy in iptables mode and
# CoreDNS on the bridge's address, both host processes, as on a node that runs them outside pods.
# Kubernetes binaries come from tools/k8s/build.sh, images from `make images`.
# Then: Kafka in the cluster (tools/k8s/manifests/kafka.yaml), the provider stand-in, and
# `helm install --wait` of charts/baton; the gateway's Service is forwarded to 127.0.0.1:8080
# (tools/k8s/forward.py: through kube-proxy, so it survives gateway pods coming and going).
# Everything it starts is recorded under .baton/k8s; tools/k8s/down.sh removes it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

[[ "$(id -u)" == 0 ]] || { log "needs root (network namespaces, mounts, a bridge)"; exit 1; }
if [[ -d "$STATE/pids" ]] && compgen -G "$STATE/pids/*.pid" >/dev/null; then
    log "a cluster is already up (or was not taken down): run 'make k8s-down' first"
    exit 1
fi
"$HERE/packages.sh"
"$HERE/build.sh" >/dev/null
"$ROOT/tools/helm.sh" >/dev/null
started=$SECONDS

rm -rf "$STATE"
mkdir -p "$STATE"/{pids,logs,pki,etcd,containerd/root,containerd/state,cni/net.d,cni/ipam,kubelet,volumes,images}
trap 'log "failed; logs in $STATE/logs (make k8s-down cleans up)"' ERR

start() {  # start <name> <command...>: runs in the background, pid recorded for down.sh
    local name="$1"
    shift
    setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/pids/$name.pid"
}

# --- host: name, sysctls, bridge -------------------------------------------------------------
if ! grep -qE "^127\.0\.0\.1\s+$NODE_NAME(\s|$)" /etc/hosts; then
    echo "127.0.0.1 $NODE_NAME" >>/etc/hosts
    touch "$STATE/added-hosts-entry"
fi
for key in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables; do
    echo "$key=$(sysctl -n "$key")" >>"$STATE/sysctl.saved"
    # Routed pod-to-Service traffic needs forwarding; kube-proxy's rules must see bridged packets.
    sysctl -qw "$key=1"
done
ip link add "$BRIDGE" type bridge
touch "$STATE/bridge-created"
ip addr add "$BRIDGE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up

# --- keys and credentials --------------------------------------------------------------------
PKI="$STATE/pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=baton-local-ca" \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' \
    "$KUBERNETES_SERVICE_IP" >"$PKI/apiserver.ext"
openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 7 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2>/dev/null
# The aggregation layer: the API server proxies metrics.k8s.io to metrics-server as this client,
# which metrics-server trusts through the front-proxy CA.
openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=baton-front-proxy-ca" \
    -keyout "$PKI/front-proxy-ca.key" -out "$PKI/front-proxy-ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" \
    -keyout "$PKI/front-proxy-client.key" -out "$PKI/front-proxy-client.csr" 2>/dev/null
echo "extendedKeyUsage=clientAuth" >"$PKI/front-proxy-client.ext"
openssl x509 -req -in "$PKI/front-proxy-client.csr" -CA "$PKI/front-proxy-ca.crt" -CAkey "$PKI/front-proxy-ca.key" \
    -CAcreateserial -days 7 -extfile "$PKI/front-proxy-client.ext" -out "$PKI/front-proxy-client.crt" 2>/dev/null
openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
# One admin token for the cluster's own components and the developer; the cluster lives on loopback
# and for the length of a session.
TOKEN="$(openssl rand -hex 24)"
echo "$TOKEN,baton-admin,baton-admin,system:masters" >"$PKI/tokens.csv"
chmod 600 "$PKI"/*

# --- control plane ---------------------------------------------------------------------------
ETCD_PORT="$(free_port)"
ETCD_PEER_PORT="$(free_port)"
API_PORT="$(free_port)"
start etcd etcd --name baton --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "baton=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" --logger zap
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --token-auth-file "$PKI/tokens.csv" --authorization-mode RBAC --anonymous-auth=false \
    --service-cluster-ip-range "$SERVICE_CIDR" --endpoint-reconciler-type none \
    --kubelet-preferred-address-types Hostname --allow-privileged=false \
    --enable-admission-plugins NamespaceLifecycle,ServiceAccount,DefaultStorageClass,ResourceQuota \
    --cert-dir "$PKI/apiserver-generated" \
    --requestheader-client-ca-file "$PKI/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$PKI/front-proxy-client.crt" --proxy-client-key-file "$PKI/front-proxy-client.key" \
    --enable-aggregator-routing=true

cat >"$KUBECONFIG_FILE" <<KC
apiVersion: v1
kind: Config
clusters:
  - name: baton-local
    cluster:
      server: https://127.0.0.1:$API_PORT
      certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
  - name: baton-admin
    user:
      token: $TOKEN
contexts:
  - name: baton-local
    context: {cluster: baton-local, user: baton-admin, namespace: $NAMESPACE}
current-context: baton-local
KC
chmod 600 "$KUBECONFIG_FILE"
wait_for 60 "the API server" kubectl get --raw /readyz
log "API server ready on 127.0.0.1:$API_PORT ($((SECONDS - started))s)"

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=false --service-cluster-ip-range "$SERVICE_CIDR" \
    --horizontal-pod-autoscaler-sync-period 5s --horizontal-pod-autoscaler-downscale-stabilization 30s
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "$(free_port)"

# --- node ------------------------------------------------------------------------------------
cat >"$STATE/cni/net.d/10-baton.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "baton",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "subnet": "$POD_CIDR", "gateway": "$BRIDGE_IP",
               "dataDir": "$STATE/cni/ipam", "routes": [{"dst": "0.0.0.0/0"}]}
    }
  ]
}
CNI
CONTAINERD_SOCK="$STATE/containerd/containerd.sock"
cat >"$STATE/containerd/config.toml" <<TOML
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/baton-pause:1"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$HERE/runc-wrapper.sh"
        SystemdCgroup = false
TOML
start containerd containerd --config "$STATE/containerd/config.toml"
wait_for 30 "containerd" ctr --address "$CONTAINERD_SOCK" version

"$HERE/load-images.sh" "$CONTAINERD_SOCK"
log "images loaded ($((SECONDS - started))s)"

KUBELET_PORT="$(free_port)"
cat >"$STATE/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $(free_port)
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
clusterDomain: cluster.local
clusterDNS: [$BRIDGE_IP]
resolvConf: ""
podLogsDir: $STATE/logs/pods
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
maxPods: 80
YAML
start kubelet "$BIN/kubelet" --config "$STATE/kubelet/config.yaml" --kubeconfig "$KUBECONFIG_FILE" \
    --hostname-override "$NODE_NAME" --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki"

start kube-proxy "$BIN/kube-proxy" --kubeconfig "$KUBECONFIG_FILE" --hostname-override "$NODE_NAME" \
    --proxy-mode iptables --cluster-cidr "$POD_CIDR" \
    --metrics-bind-address "127.0.0.1:$(free_port)" --healthz-bind-address "127.0.0.1:$(free_port)" \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0

DNS_HEALTH_PORT="$(free_port)"
DNS_READY_PORT="$(free_port)"
cat >"$STATE/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 {
    bind $BRIDGE_IP
    errors
    health 127.0.0.1:$DNS_HEALTH_PORT
    ready 127.0.0.1:$DNS_READY_PORT
    kubernetes cluster.local in-addr.arpa {
        kubeconfig $KUBECONFIG_FILE baton-local
        pods insecure
    }
    cache 5
}
COREFILE
start coredns "$BIN/coredns" -conf "$STATE/Corefile"

wait_for 90 "node $NODE_NAME Ready" kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=2s
wait_for 30 "CoreDNS" curl -sf "http://127.0.0.1:$DNS_READY_PORT/ready"
log "node ready ($((SECONDS - started))s)"

# metrics-server scrapes the kubelet (anonymous here, on loopback) and is reached by the API server at
# the bridge's address: a Service without selector whose Endpoints name that address.
METRICS_PORT="$(free_port)"
start metrics-server "$BIN/metrics-server" --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --bind-address "$BRIDGE_IP" --secure-port "$METRICS_PORT" --cert-dir "$STATE/metrics-server" \
    --kubelet-insecure-tls --kubelet-preferred-address-types Hostname --kubelet-use-node-status-port \
    --metric-resolution 15s
kubectl apply -f - >/dev/null <<MS
apiVersion: v1
kind: Service
metadata: {name: metrics-server, namespace: kube-system}
spec:
  ports: [{name: https, port: 443, targetPort: $METRICS_PORT}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: metrics-server, namespace: kube-system}
subsets:
  - addresses: [{ip: $BRIDGE_IP}]
    ports: [{name: https, port: $METRICS_PORT}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {name: v1beta1.metrics.k8s.io}
spec:
  group: metrics.k8s.io
  version: v1beta1
  service: {name: metrics-server, namespace: kube-system, port: 443}
  # metrics-server's certificate is self-signed, as in its upstream manifests.
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100
MS

"$HERE/install.sh"

# --- the gateway on 127.0.0.1:8080 -----------------------------------------------------------
GATEWAY_IP="$(kubectl -n "$NAMESPACE" get service "$RELEASE-gateway" -o jsonpath='{.spec.clusterIP}')"
start port-forward python3 "$HERE/forward.py" --listen-port "$GATEWAY_PORT" --target "$GATEWAY_IP:8080"
wait_for 30 "the port-forward" curl -sf "http://127.0.0.1:$GATEWAY_PORT/health/live"
echo "http://127.0.0.1:$GATEWAY_PORT/v1" >"$STATE/gateway-url"
log "up in $((SECONDS - started))s: gateway http://127.0.0.1:$GATEWAY_PORT/v1, kubeconfig $KUBECONFIG_FILE"
