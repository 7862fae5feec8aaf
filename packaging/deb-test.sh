#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Debian packages end to end on this machine (CI runs the same steps in
# a fresh Debian 12 root: packaging/deb-clean-root.sh): build them from a clean
# export of the checkout (tracked files only, with their uncommitted
# changes), lintian (no errors), `apt-get install ./*.deb`, the
# installed-files check (packaging/check-installed.sh), `pip install
# client/python` in a fresh virtual environment, a reinstall (an edited
# conffile stays), then remove (the conffile and the user stay) and purge
# (both go). The machine is left without the packages. Run as root (or
# through sudo), from anywhere.
#
# Usage: deb-test.sh [--debs DIR]
#   --debs DIR  take the packages built in DIR (its *.deb) instead of
#               building them; no lintian (the builder runs it). CI's
#               packaging/deb-clean-root.sh runs it so, inside a fresh root.
# Environment: DEB_JOBS (default 2) for dpkg-buildpackage -j.
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
debs=""
if [ "${1:-}" = "--debs" ] && [ -n "${2:-}" ]; then
    debs=$(cd "$2" && pwd)
elif [ $# -gt 0 ]; then
    echo "usage: deb-test.sh [--debs DIR]" >&2
    exit 2
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-deb-XXXXXX")
pkgs="kvshared libkvshare1 libkvshare-dev kvshare-tools python3-kvshare"
# Wait for the dpkg lock (another apt on the machine) instead of failing.
APT_WAIT="-oDPkg::Lock::Timeout=300"
installed=0
cleanup() {
    if [ "$installed" = 1 ]; then
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$APT_WAIT" purge -y -qq $pkgs >/dev/null 2>&1 ||
            echo "deb-test: could not purge $pkgs: remove them by hand" >&2
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "deb-test: $*" >&2
    exit 1
}
for p in $pkgs; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        fail "$p is installed already: remove it first (this test purges what it installs)"
    fi
done

if [ -n "$debs" ]; then
    src=$repo
    echo "-- the packages in $debs"
    ls "$debs"/*.deb
else
    src=$tmp/src
    echo "-- export the checkout"
    mkdir "$tmp/src"
    # stash create: a commit of the working tree's tracked (and staged) files,
    # or nothing when it is clean; the identity is only for that object.
    rev=$(git -C "$repo" -c user.name=deb-test -c user.email=deb-test@localhost stash create)
    git -C "$repo" archive --format=tar "${rev:-HEAD}" | tar -x -C "$tmp/src"

    echo "-- dpkg-buildpackage -us -uc -b (nocheck: the suite ran in the build stage)"
    # DPKG_GENSYMBOLS_CHECK_LEVEL=2: a kvs_ symbol missing from
    # debian/libkvshare1.symbols fails the build, as a vanished one always does.
    (cd "$tmp/src" &&
        DEB_BUILD_OPTIONS="nocheck noddebs" DPKG_GENSYMBOLS_CHECK_LEVEL=2 \
            dpkg-buildpackage -us -uc -b -j"${DEB_JOBS:-2}" >"$tmp/build.log" 2>&1) ||
        { tail -60 "$tmp/build.log"; fail "dpkg-buildpackage failed (log above)"; }
    grep "cuda backend" "$tmp/build.log" || true
    ls "$tmp"/*.deb
    debs=$tmp

    echo "-- lintian (errors fail; warnings are listed in docs/DEPLOYING.md)"
    lintian --fail-on error "$tmp"/kvshare_*.changes
fi

echo "-- apt-get install ./*.deb"
installed=1
(cd "$debs" && DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$APT_WAIT" install -y -qq ./*.deb >"$tmp/install.log" 2>&1) ||
    { cat "$tmp/install.log"; fail "apt-get install failed"; }
$SUDO sh "$repo/packaging/check-installed.sh"

echo "-- pip install client/python into a fresh venv (offline), over the installed libkvshare1"
/usr/bin/python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-build-isolation --no-index "$src/client/python"
(cd "$tmp" && env -u KVSHARE_LIB -u PYTHONPATH "$tmp/venv/bin/python" - <<'PY'
import kvshare

for engine in ("vllm", "sglang"):
    # The plug-ins derive from the engines' own classes: without the engine
    # they refuse to import, naming it (docs/ENGINES.md).
    try:
        __import__("kvshare." + engine)
    except ImportError as e:
        assert "kvshare.%s needs" % engine in str(e), e


assert "/venv/" in kvshare.__file__, kvshare.__file__
lib = kvshare.load_library()
assert lib._name == "libkvshare.so.1", lib._name
print("venv: kvshare", kvshare.__file__, "over", lib._name)
PY
)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
(cd "$tmp" && KVSHARE_LIB="/usr/lib/$multiarch/libkvshare.so.1" "$tmp/venv/bin/python" -c \
    "import kvshare, sys; n = kvshare.load_library()._name; print('venv: KVSHARE_LIB:', n); sys.exit(n != sys.argv[1])" \
    "/usr/lib/$multiarch/libkvshare.so.1")

echo "-- reinstalling keeps the operator's edit of the conffile"
echo "# edited by the operator" | $SUDO tee -a /etc/kvshare/kvshared.conf >/dev/null
(cd "$debs" && DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$APT_WAIT" install -y -qq --reinstall \
    ./kvshared_*.deb >"$tmp/reinstall.log" 2>&1) ||
    { cat "$tmp/reinstall.log"; fail "apt-get install --reinstall failed"; }
grep -q "^# edited by the operator" /etc/kvshare/kvshared.conf ||
    fail "reinstalling kvshared replaced the edited /etc/kvshare/kvshared.conf"

echo "-- remove keeps the config and the user; purge removes them"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$APT_WAIT" remove -y -qq kvshared >/dev/null
test -f /etc/kvshare/kvshared.conf || fail "remove deleted /etc/kvshare/kvshared.conf"
getent passwd kvshare >/dev/null || fail "remove deleted the user kvshare"
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $SUDO apt-get "$APT_WAIT" purge -y -qq $pkgs >/dev/null
installed=0
test ! -e /etc/kvshare || fail "purge left /etc/kvshare"
! getent passwd kvshare >/dev/null || fail "purge left the user kvshare"
! getent group kvshare >/dev/null || fail "purge left the group kvshare"
echo "deb-test: ok"
