#!/usr/bin/env bash
# Installs the Debian packages the local cluster and the image builds need, at pinned versions.
# A second call only checks that every pinned version is installed.
#
#   tools/k8s/packages.sh
set -euo pipefail

PACKAGES=(
    "podman=4.3.1+ds1-8+deb12u1+b3"
    "buildah=1.28.2+ds1-3+deb12u1+b3"
    "skopeo=1.9.3+ds1-1+b10"
    "mmdebstrap=1.3.5-7"
    "runc=1.1.5+ds1-1+deb12u1"
    "uidmap=1:4.13+dfsg1-1+deb12u2"
    "fuse-overlayfs=1.10-1"
    "containernetworking-plugins=1.1.1+ds1-3+b5"
    "containerd=1.6.20~ds1-1+deb12u3"
    "etcd-server=3.4.23-4+b4"
    "iptables=1.8.9-2"
    "conntrack=1:1.4.7-1+b2"
    "iproute2"
    "openssl"
)

missing=()
for spec in "${PACKAGES[@]}"; do
    name="${spec%%=*}"
    want="${spec#*=}"
    have="$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$name" 2>/dev/null || true)"
    if [[ "$spec" == "$name" ]]; then
        [[ "$have" == installed* ]] || missing+=("$name")
    elif [[ "$have" != "installed $want" ]]; then
        missing+=("$spec")
    fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"
echo "tools/k8s/packages.sh: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
# The Debian service units of containerd and etcd must not start system-wide daemons: the cluster
# scripts run their own, with their own sockets and data directories.
$SUDO env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
