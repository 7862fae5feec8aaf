#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Debian packages as an operator gets them on a clean machine: a fresh
# Debian 12 root (debootstrap --variant=minbase bookworm, Debian's mirror
# only), a clean export of one commit (git archive) in it, then, inside the
# root, README's commands: `apt-get build-dep -y ./` and
# `dpkg-buildpackage -us -uc -b` (DEB_BUILD_OPTIONS="nocheck noddebs": the
# suite runs in CI's build stage). A Build-Depends that debian/control
# forgets fails here, where the build machine's own packages cannot hide it.
# Then lintian (on this machine, over the built files) and, inside the root,
# packaging/deb-test.sh --debs: apt-get install of the packages, the
# installed files (packaging/check-installed.sh, man pages included), a venv,
# reinstall, remove and purge.
#
# The minbase root is cached as a tarball under .cache/ (git ignores it),
# rebuilt when older than KVS_ROOT_MAX_AGE_DAYS (default 7); the .debs apt
# fetches are cached beside it. So is the root after `apt-get build-dep`,
# keyed by debian/control and the minbase root: the same control file on
# the same root installs the same packages, and a changed one (a package
# added or removed) starts again from minbase. Each run unpacks a fresh
# copy, which it unmounts and deletes at the end, on failure too.
#
# Run as root, from anywhere. Usage: deb-clean-root.sh [REV [OUTDIR]]
#   REV     the commit to build (default HEAD; uncommitted changes are not
#           in it: commit first)
#   OUTDIR  where to copy the built .debs, .changes and .buildinfo (default:
#           none kept)
# deb-clean-root.sh --tarball: make the cached root if it is missing or old,
# print its path, and stop (packaging/container/build.sh imports it).
# Environment: KVS_ROOT_CACHE (default REPO/.cache/deb-root), DEB_JOBS
# (default 2), KVS_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# KVS_DEB_BUILD_OPTIONS (default "nocheck noddebs"; "noddebs" runs the test
# suite in the package build, with the <!nocheck> Build-Depends alone).
set -eu
start=$(date +%s)
repo=$(cd "$(dirname "$0")/.." && pwd)
tarball_only=0
[ "${1:-}" = "--tarball" ] && tarball_only=1 && shift
rev=${1:-HEAD}
outdir=${2:-}
mirror=${KVS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${KVS_ROOT_CACHE:-$repo/.cache/deb-root}
arch=$(dpkg --print-architecture)
tarball="$cache/bookworm-minbase-$arch.tar"

fail() {
    echo "deb-clean-root: $*" >&2
    exit 1
}
[ "$(id -u)" -eq 0 ] || fail "run as root (debootstrap, chroot and mount need it)"
command -v debootstrap >/dev/null || fail "no debootstrap: tools/install-deps.sh installs it"
commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}") || fail "no commit $rev"

mkdir -p "$cache/archives/partial"
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/kvs-root-XXXXXX")
root="$tmp/root"

# Everything mounted under the root, deepest last in the list; cleanup
# unmounts in reverse and deletes the root only when nothing is left mounted
# (a bind mount of the apt cache must not be emptied through the root).
mounts=""
mount_in() { # mount_in TARGET MOUNT-ARGS...
    target=$1
    shift
    mkdir -p "$target"
    mount "$@" "$target"
    mounts="$target $mounts"
}
cleanup() {
    rc=$?
    # Processes still running inside the root (a daemon of a check that
    # failed halfway) hold its mounts: stop them, by pid.
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill "${p#/proc/}" 2>/dev/null
    done
    for m in $mounts; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    if grep -q " $root/" /proc/mounts; then
        echo "deb-clean-root: still mounted under $root; not deleted:" >&2
        grep " $root/" /proc/mounts >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "-- a minbase Debian 12 root" >&2
t0=$(date +%s)
age=${KVS_ROOT_MAX_AGE_DAYS:-7}
if [ -z "$(find "$tarball" -mtime -"$age" 2>/dev/null)" ]; then
    echo "debootstrap --variant=minbase bookworm ($mirror), cached as $tarball" >&2
    # flock: two runs at once make it once.
    (
        flock 9
        if [ -z "$(find "$tarball" -mtime -"$age" 2>/dev/null)" ]; then
            fresh="$tmp/fresh"
            debootstrap --variant=minbase --cache-dir="$cache/archives" bookworm "$fresh" "$mirror" \
                >"$tmp/debootstrap.log" 2>&1 ||
                { tail -30 "$tmp/debootstrap.log"; exit 1; }
            cat >"$fresh/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian}/debian-security bookworm-security main
EOF
            rm -f "$fresh"/var/cache/apt/archives/*.deb
            tar -C "$fresh" -cf "$tarball.new" . && mv "$tarball.new" "$tarball"
            rm -rf "$fresh"
        fi
    ) 9>"$cache/lock" || fail "debootstrap failed (log above)"
fi
if [ "$tarball_only" = 1 ]; then
    echo "$tarball"
    exit 0
fi
key=$({ git -C "$repo" show "$commit:debian/control" && stat -c %Y "$tarball"; } | sha256sum | cut -c1-16)
deps_tarball="$cache/bookworm-builddeps-$arch-$key.tar"
mkdir "$root"
if [ -f "$deps_tarball" ]; then
    echo "(build dependencies of this debian/control cached: $deps_tarball)"
    tar -C "$root" -xf "$deps_tarball"
else
    tar -C "$root" -xf "$tarball"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount_in "$root/proc" -t proc proc
mount_in "$root/dev/pts" -t devpts -o newinstance,ptmxmode=0666 devpts
mount_in "$root/dev/shm" -t tmpfs -o mode=1777 tmpfs
mount_in "$root/var/cache/apt/archives" --bind "$cache/archives"
echo "root ready in $(($(date +%s) - t0)) s"

echo "-- git archive $commit into the root's /src"
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
    echo "(uncommitted changes in $repo are not in it)"
fi
mkdir "$root/build"
git -C "$repo" archive --format=tar --prefix=src/ "$commit" | tar -x -C "$root/build"

echo "-- in the root: apt-get update && apt-get build-dep -y ./ (README's commands)"
t0=$(date +%s)
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive /bin/sh -euc '
cd /build/src
apt-get update -qq
apt-get build-dep -y -qq ./ >/build/build-dep.log 2>&1 ||
    { cat /build/build-dep.log; echo "apt-get build-dep failed"; exit 1; }
echo "$(grep -c "^Setting up" /build/build-dep.log || true) packages set up"
' || fail "apt-get build-dep failed in a clean root (above)"
echo "build dependencies in $(($(date +%s) - t0)) s"
if [ ! -f "$deps_tarball" ]; then
    rm -f "$cache"/bookworm-builddeps-*.tar
    tar -C "$root" --anchored --exclude=./build --exclude=./proc --exclude=./dev/pts \
        --exclude=./dev/shm --exclude=./var/cache/apt/archives -cf "$deps_tarball.$$" . &&
        mv "$deps_tarball.$$" "$deps_tarball"
fi

options=${KVS_DEB_BUILD_OPTIONS:-nocheck noddebs}
echo "-- in the root: dpkg-buildpackage -us -uc -b ($options)"
t0=$(date +%s)
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive DEB_JOBS="${DEB_JOBS:-2}" DEB_BUILD_OPTIONS="$options" \
    /bin/sh -euc '
cd /build/src
# DPKG_GENSYMBOLS_CHECK_LEVEL=2: a kvs_ symbol missing from the symbols file
# fails the build, as a vanished one always does.
DPKG_GENSYMBOLS_CHECK_LEVEL=2 \
    dpkg-buildpackage -us -uc -b -j"$DEB_JOBS" >/build/build.log 2>&1 ||
    { grep -i -m 20 "not found\|error" /build/build.log; echo ...; tail -30 /build/build.log
      echo "dpkg-buildpackage failed"; exit 1; }
grep "cuda backend" /build/build.log || true
ls /build/*.deb
' || {
    log="${TMPDIR:-/var/tmp}/kvs-deb-build-$(echo "$commit" | cut -c1-12).log"
    cp "$root/build/build.log" "$log" 2>/dev/null && echo "the whole log: $log"
    fail "the packages do not build in a clean root (above)"
}
echo "built in $(($(date +%s) - t0)) s"

echo "-- lintian (errors fail; warnings are listed in docs/DEPLOYING.md)"
if command -v lintian >/dev/null; then
    lintian --fail-on error "$root"/build/kvshare_*.changes
else
    fail "no lintian here: tools/install-deps.sh installs it"
fi
if [ -n "$outdir" ]; then
    mkdir -p "$outdir"
    cp "$root"/build/*.deb "$root"/build/*.changes "$root"/build/*.buildinfo "$outdir"/
fi

echo "-- in the root: packaging/deb-test.sh --debs (install, check-installed, venv, purge)"
t0=$(date +%s)
chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    DEBIAN_FRONTEND=noninteractive /bin/sh -euc '
# What an operator adds: man (man-db), python3-venv for an engine venv.
apt-get install -y -qq --no-install-recommends man-db python3-venv >/build/tools.log 2>&1 ||
    { cat /build/tools.log; exit 1; }
sh /build/src/packaging/deb-test.sh --debs /build
' || fail "the installed packages fail their checks in a clean root (above)"
echo "checked in $(($(date +%s) - t0)) s"
echo "deb-clean-root: ok ($commit) in $(($(date +%s) - start)) s"
