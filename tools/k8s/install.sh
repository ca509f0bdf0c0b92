#!/usr/bin/env bash
# Installs Baton on the running local cluster: storage, Kafka, the provider stand-in, the secrets
# the chart refers to, then `helm install --wait` of charts/baton with tools/k8s/values-local.yaml.
# The gateway API keys it creates are written to .baton/k8s/api-key (chat, for the developer and the
# tests) and .baton/k8s/eval-key (chat and eval, for graded traffic).
#
#   tools/k8s/install.sh      (run by tools/k8s/up.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
TAG="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/baton/Chart.yaml")"
started=$SECONDS

kubectl create namespace "$NAMESPACE" >/dev/null
kubectl create namespace "$KAFKA_NAMESPACE" >/dev/null

# Storage: no provisioner runs here, so the claims bind to volumes on this node's disk, as a
# static local-volume setup provides them. Each folder is owned by the pods' user.
for i in 1 2 3 4 5 6; do
    dir="$STATE/volumes/pv$i"
    mkdir -p "$dir"
    chown 10001:10001 "$dir"
    kubectl apply -f - >/dev/null <<PV
apiVersion: v1
kind: PersistentVolume
metadata: {name: baton-local-pv$i}
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  persistentVolumeReclaimPolicy: Delete
  storageClassName: ""
  hostPath: {path: $dir, type: Directory}
PV
done

CLUSTER_ID="$(python3 -c 'import base64, uuid; print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))')"
sed -e "s/__TAG__/$TAG/" -e "s/__CLUSTER_ID__/$CLUSTER_ID/" "$HERE/manifests/kafka.yaml" | kubectl apply -f - >/dev/null
sed -e "s/__TAG__/$TAG/" "$HERE/manifests/standin.yaml" | kubectl apply -f - >/dev/null

# A slice of the routing matrix for the sim workers (a ConfigMap holds at most 1 MiB).
python3 - "$ROOT/data/routing/mmlu_pro_dev.csv" "$STATE/matrix.csv" <<'PY'
import csv, sys
csv.field_size_limit(sys.maxsize)
with open(sys.argv[1], newline="", encoding="utf-8") as src, open(sys.argv[2], "w", newline="", encoding="utf-8") as out:
    reader = csv.DictReader(src)
    writer = csv.DictWriter(out, fieldnames=reader.fieldnames)
    writer.writeheader()
    for n, row in enumerate(reader):
        if n == 60:
            break
        writer.writerow(row)
PY
kubectl -n "$NAMESPACE" create configmap baton-routing-matrix --from-file=matrix.csv="$STATE/matrix.csv" >/dev/null

# Two keys of the default tenant: the developer's (chat), and an evaluation harness's (chat+eval: it may
# name the graded items whose rewards train the routing policy).
entries=""
for name in api-key:chat eval-key:chat+eval; do
    key="$(python3 -c 'import secrets; print("bt-" + secrets.token_urlsafe(32))')"
    printf '%s' "$key" >"$STATE/${name%%:*}"
    chmod 600 "$STATE/${name%%:*}"
    entries="$entries${entries:+,}default:$(printf '%s' "$key" | sha256sum | cut -d' ' -f1):${name#*:}"
done
kubectl -n "$NAMESPACE" create secret generic baton-gateway-api-keys --from-literal=api-keys="$entries" >/dev/null

kubectl -n "$KAFKA_NAMESPACE" rollout status statefulset/kafka --timeout=180s >/dev/null
log "Kafka ready ($((SECONDS - started))s)"
helm install "$RELEASE" "$ROOT/charts/baton" -n "$NAMESPACE" -f "$HERE/values-local.yaml" --wait --timeout 10m >/dev/null
kubectl -n "$NAMESPACE" rollout status deployment/baton-standin --timeout=120s >/dev/null
log "helm install --wait done ($((SECONDS - started))s)"
