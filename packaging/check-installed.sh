#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Checks the files the Debian packages installed, without systemd: the
# kvshare user and group, the conffile, `kvshared --check-config`, the
# documents and man pages, the daemon started as the unit starts it (user
# kvshare, socket in a directory like /run/kvshare) and pinged with the CLI,
# its metrics on a free port, `kvshare calc`, a program
# built against libkvshare-dev with pkg-config and with CMake, and the
# Python package with Debian's python3 (the plug-ins import, the binding
# finds libkvshare.so.1 on the library path and talks to the daemon).
# Run as root after `apt-get install ./*.deb`, on a fresh machine or on a
# configured node: its daemon runs from the shipped example config (a 1 GiB
# host pool, as /etc/kvshare/kvshared.conf is at install), on its own socket
# and a free metrics port, so a node's running kvshared, its sized pool and
# its ports are left alone. Usage: check-installed.sh
set -eu

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-installed-XXXXXX")
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
    echo "check-installed: $*" >&2
    exit 1
}
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

echo "-- packages, user, conffile, unit"
for p in kvshared libkvshare1 libkvshare-dev kvshare-tools python3-kvshare; do
    dpkg-query -W -f='${Status}\n' "$p" | grep -q "install ok installed" || fail "$p not installed"
done
getent passwd kvshare >/dev/null || fail "no user kvshare"
getent group kvshare >/dev/null || fail "no group kvshare"
dpkg-query -W -f='${Conffiles}\n' kvshared | grep -q "^ /etc/kvshare/kvshared.conf " ||
    fail "/etc/kvshare/kvshared.conf is not a conffile of kvshared"
unit=/lib/systemd/system/kvshared.service
grep -q "^User=kvshare" "$unit" || fail "$unit: no User=kvshare"
grep -q "^RuntimeDirectory=kvshare" "$unit" || fail "$unit: no RuntimeDirectory=kvshare"
grep -q "^StateDirectory=kvshare" "$unit" || fail "$unit: no StateDirectory=kvshare (the disk tier)"
grep -q "^ExecStart=/usr/bin/kvshared --config /etc/kvshare/kvshared.conf" "$unit" ||
    fail "$unit: ExecStart does not run /usr/bin/kvshared with /etc/kvshare/kvshared.conf"
test -f /usr/share/kvshare/prometheus/kvshare-rules.yml || fail "no Prometheus rules"
test -f /usr/share/kvshare/grafana/kvshare.json || fail "no Grafana dashboard"

echo "-- documents and man pages"
for d in OPERATING RELIABILITY CLUSTER ENGINES DEPLOYING; do
    ls /usr/share/doc/kvshared/$d.md* >/dev/null 2>&1 || fail "no /usr/share/doc/kvshared/$d.md"
done
test -f /usr/share/man/man8/kvshared.8.gz || fail "no /usr/share/man/man8/kvshared.8.gz"
test -f /usr/share/man/man1/kvshare.1.gz || fail "no /usr/share/man/man1/kvshare.1.gz"
if command -v man >/dev/null; then
    man -w kvshared | grep -q "/man8/kvshared.8" || fail "man -w kvshared does not find kvshared(8)"
    man -w kvshare | grep -q "/man1/kvshare.1" || fail "man -w kvshare does not find kvshare(1)"
    # Formatted without warnings from groff.
    for page in kvshared kvshare; do
        MANWIDTH=80 man --warnings "$page" 2>&1 >/dev/null | grep . && fail "$page: roff warnings"
    done
    MANWIDTH=80 man kvshared 2>/dev/null | grep -q "metrics-listen" ||
        fail "kvshared(8) does not list --metrics-listen"
fi

echo "-- kvshared --check-config, kvshare calc"
kvshared --version
kvshared --check-config /etc/kvshare/kvshared.conf
kvshare calc --model llama-3.1-8b --budget 40GiB --context 4k,32k >"$tmp/calc.txt"
grep -q . "$tmp/calc.txt" || fail "kvshare calc printed nothing"
head -3 "$tmp/calc.txt"

echo "-- kvshared as user kvshare, with the shipped config, a free metrics port; kvshare ping"
# /run/kvshare as RuntimeDirectory makes it: owned by kvshare, mode 0750.
rundir="$tmp/run"
install -d -o kvshare -g kvshare -m 0750 "$rundir"
chmod 0755 "$tmp"
sock="$rundir/kvshared.sock"
# A port the kernel just gave out and took back: free unless taken in between.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
setpriv --reuid=kvshare --regid=kvshare --init-groups \
    kvshared --config /usr/share/kvshare/examples/kvshared.conf --socket "$sock" --backend host \
    --metrics-listen "127.0.0.1:$port" >"$tmp/kvshared.log" 2>&1 &
daemon_pid=$!
i=0
until [ -S "$sock" ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] || { cat "$tmp/kvshared.log"; fail "kvshared made no socket in 10 s"; }
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$tmp/kvshared.log"; fail "kvshared exited"; }
    sleep 0.1
done
kvshare ping --socket "$sock" --count 2 --interval 0.05
python3 - "$port" <<'PY' || fail "no metrics on 127.0.0.1:$port"
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read()
assert b"kvshare_blocks" in text, text[:200]
PY

echo "-- a program built against libkvshare-dev: pkg-config, then CMake"
cat >"$tmp/hello.c" <<'C'
#include <kvshare.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    kvs_options_t opts;
    kvs_client_t *c = NULL;
    kvs_geometry_t g;
    kvs_options_init(&opts);
    opts.socket_path = argc > 1 ? argv[1] : NULL;
    int rc = kvs_connect(&opts, &c);
    if (rc == 0)
        rc = kvs_geometry(c, &g);
    if (rc != 0) {
        fprintf(stderr, "hello: %s\n", kvs_strerror(rc));
        return 1;
    }
    printf("kvshare %d.%d.%d: connected, %u blocks of %u tokens\n", KVS_VERSION_MAJOR,
           KVS_VERSION_MINOR, KVS_VERSION_PATCH, g.num_blocks, g.block_tokens);
    kvs_close(c);
    return 0;
}
C
# shellcheck disable=SC2046
cc -Wall -Werror -o "$tmp/hello_pc" "$tmp/hello.c" $(pkg-config --cflags --libs kvshare)
"$tmp/hello_pc" "$sock"
# /lib is /usr/lib on a merged-/usr system: ldd may name either.
ldd "$tmp/hello_pc" | grep -q "libkvshare.so.1 => \(/usr\)\{0,1\}/lib/$multiarch/libkvshare.so.1" ||
    { ldd "$tmp/hello_pc"; fail "hello_pc does not load /usr/lib/$multiarch/libkvshare.so.1"; }
mkdir "$tmp/cm"
cp "$tmp/hello.c" "$tmp/cm/"
cat >"$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(kvshare_user C)
find_package(kvshare REQUIRED)
add_executable(hello_cmake hello.c)
target_link_libraries(hello_cmake PRIVATE kvshare::kvshare)
add_executable(hello_cmake_static hello.c)
target_link_libraries(hello_cmake_static PRIVATE kvshare::kvshare_static)
CM
{ cmake -S "$tmp/cm" -B "$tmp/cm/build" && cmake --build "$tmp/cm/build"; } >"$tmp/cm.log" 2>&1 ||
    { cat "$tmp/cm.log"; fail "find_package(kvshare) build failed"; }
"$tmp/cm/build/hello_cmake" "$sock"
"$tmp/cm/build/hello_cmake_static" "$sock"

echo "-- python3-kvshare with Debian's python3"
(cd "$tmp" && env -u KVSHARE_LIB -u PYTHONPATH /usr/bin/python3 - "$sock" <<'PY'
import sys
import kvshare

for engine in ("vllm", "sglang"):
    # The plug-ins derive from the engines' own classes: without the engine
    # they refuse to import, naming it (docs/ENGINES.md).
    try:
        __import__("kvshare." + engine)
    except ImportError as e:
        assert "kvshare.%s needs" % engine in str(e), e


assert kvshare.__file__.startswith("/usr/lib/python3/dist-packages/"), kvshare.__file__
lib = kvshare.load_library()
print("python3-kvshare:", kvshare.__file__, "over", lib._name)
with kvshare.Client(socket_path=sys.argv[1]) as c:
    print("geometry: %d blocks of %d tokens" % (c.geometry["num_blocks"],
                                                c.geometry["block_tokens"]))
PY
)
echo "check-installed: ok"
