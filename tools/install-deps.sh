#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages kvshare builds and tests with. Idempotent: it
# asks apt only for what is missing. Run as root (or through sudo).
set -eu

pkgs="build-essential cmake pkg-config libuv1-dev libxxhash-dev libprotobuf-c-dev
protobuf-c-compiler check valgrind clang-format python3 python3-torch curl clang libclang-rt-14-dev
abigail-tools prometheus libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
python3-cbor2 python3-xxhash tmux libhiredis-dev redis-server redis-tools liburing-dev
debhelper dh-python lintian python3-venv python3-kubernetes python3-yaml debootstrap man-db"
# Debian packages (debian/, packaging/deb-test.sh): debhelper, dh-python,
# lintian; python3-venv for the `pip install client/python` check;
# debootstrap for the fresh root CI builds them in (packaging/deb-clean-root.sh);
# man-db for the man pages' check. podman is not installed here: CI builds the
# container image where it is (packaging/container/build.sh). The
# Kubernetes manifests' offline check: python3-kubernetes (the API types),
# python3-yaml, and kubectl for `kubectl kustomize`: Debian's
# kubernetes-client unless a kubectl is installed already (another
# package's kubectl owns /usr/bin/kubectl; either renders the kustomization).
command -v kubectl >/dev/null 2>&1 || pkgs="$pkgs kubernetes-client"

missing=""
for p in $pkgs; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing:$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
