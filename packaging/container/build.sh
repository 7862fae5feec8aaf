#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds kvshared's image (packaging/container/Containerfile) offline and
# runs it, as CI does where podman is installed. No registry is needed: the
# base image is the minbase Debian 12 root of packaging/deb-clean-root.sh
# (debootstrap, Debian's mirror), imported as localhost/kvshare-base:bookworm;
# the cuda stage is that base too, so the daemon is host-only. The context
# is a git archive of one commit, so nothing uncommitted or built gets in.
# Then, in the image: kvshared --version, --check-config of its config, and
# the daemon started as the image's user, answering kvshare ping.
#
# Run as root. Usage: build.sh [REV [TAG]]
#   REV  the commit (default HEAD); TAG (default localhost/kvshare:VERSION)
# Without podman it says so and exits 77 (CI reports the stage skipped).
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
rev=${1:-HEAD}
fail() {
    echo "container/build: $*" >&2
    exit 1
}
if ! command -v podman >/dev/null; then
    echo "container/build: skipped: no podman (Debian: apt-get install podman)"
    exit 77
fi
hdr="$repo/common/kvshare_version.h"
define() { sed -n "s/^#define $1 \([0-9]*\).*/\1/p" "$hdr"; }
version="$(define KVS_VERSION_MAJOR).$(define KVS_VERSION_MINOR).$(define KVS_VERSION_PATCH)"
tag=${2:-localhost/kvshare:$version}
base=localhost/kvshare-base:bookworm
commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}") || fail "no commit $rev"

tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/kvs-image-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "-- base image $base from a debootstrap root"
tarball=$("$repo/packaging/deb-clean-root.sh" --tarball)
# Imported again only when the root tarball is newer than the image.
made=$(podman image inspect --format '{{.Created.Unix}}' "$base" 2>/dev/null || echo 0)
if [ "$(stat -c %Y "$tarball")" -gt "$made" ]; then
    podman import --quiet "$tarball" "$base" >/dev/null || fail "podman import failed"
fi

# Where podman's defaults cannot run a container (seen on CI's VMs: crun
# refuses hybrid cgroups, and the default ulimits exceed the machine's hard
# limits without CAP_SYS_RESOURCE), run it with runc, cgroupfs and ulimits
# under those limits instead.
if ! podman run --rm --network none "$base" true >"$tmp/probe.log" 2>&1; then
    echo "podman's defaults fail here: $(tail -1 "$tmp/probe.log")"
    command -v runc >/dev/null || fail "and there is no runc to try (Debian: apt-get install runc)"
    nofile=$(ulimit -Hn)
    { [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ]; } && nofile=65536
    cat >"$tmp/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
EOF
    export CONTAINERS_CONF="$tmp/containers.conf"
    podman run --rm --network none "$base" true >"$tmp/probe.log" 2>&1 ||
        { cat "$tmp/probe.log"; fail "podman cannot run a container here, with runc neither"; }
    echo "so with runc, cgroupfs and ulimits nofile=$nofile, nproc=4096"
fi

echo "-- podman build $tag from $commit (host-only: the cuda stage is the base)"
mkdir "$tmp/ctx"
git -C "$repo" archive --format=tar "$commit" | tar -x -C "$tmp/ctx"
# --network host: the build stage's apt-get reaches Debian's mirror as this
# machine does, with no bridge or NAT to set up.
podman build --network host --pull=never \
    --build-arg BASE_IMAGE="$base" --build-arg CUDA_IMAGE="$base" \
    -f "$tmp/ctx/packaging/container/Containerfile" -t "$tag" "$tmp/ctx" >"$tmp/build.log" 2>&1 ||
    { tail -40 "$tmp/build.log"; fail "podman build failed (log above)"; }

echo "-- run it: --version, --check-config, the daemon answering kvshare ping"
podman run --rm --network none "$tag" kvshared --version
podman run --rm --network none "$tag" kvshared --check-config /etc/kvshare/kvshared.conf
podman run --rm --network none "$tag" sh -ec '
    kvshared --config /etc/kvshare/kvshared.conf --socket /tmp/kvshared.sock --backend host &
    i=0
    until [ -S /tmp/kvshared.sock ]; do
        i=$((i + 1)); [ "$i" -le 100 ] || exit 1; sleep 0.1
    done
    kvshare ping --socket /tmp/kvshared.sock --count 2 --interval 0.05
    kill $!' || fail "the image's daemon did not answer"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$tag"
echo "container/build: ok ($tag)"
