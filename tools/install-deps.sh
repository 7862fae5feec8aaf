#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages kvshare builds and tests with. Idempotent: it
# asks apt only for what is missing. Run as root (or through sudo).
set -eu

pkgs="build-essential cmake pkg-config libuv1-dev libxxhash-dev libprotobuf-c-dev
protobuf-c-compiler check valgrind clang-format python3 python3-torch curl clang libclang-rt-14-dev
abigail-tools prometheus libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
python3-cbor2 python3-xxhash tmux liburing-dev"

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
