#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# cmake --install into a temporary prefix, then build a tiny program against
# the installed kvshare.pc (shared) and libkvshare.a (static), and through
# find_package(kvshare) (both imported targets), and run the installed
# binaries. Usage: install_test.sh BUILD_DIR CC [extra CFLAGS...]
set -eu
build=$1
cc=$2
shift 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
pc=$(find "$tmp/prefix" -name kvshare.pc)
test -n "$pc" || { echo "no kvshare.pc installed"; cat "$tmp/install.log"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
for f in bin/kvshared bin/kvshare include/kvshare.h include/kvshare_status.h \
         include/kvshare_counters.h include/kvshare_version.h \
         lib/systemd/system/kvshared.service share/kvshare/examples/kvshared.conf \
         share/kvshare/prometheus/kvshare-rules.yml share/kvshare/grafana/kvshare.json \
         share/man/man8/kvshared.8 \
         share/man/man1/kvshare.1 share/doc/kvshare/OPERATING.md share/doc/kvshare/RELIABILITY.md \
         share/doc/kvshare/CLUSTER.md share/doc/kvshare/ENGINES.md share/doc/kvshare/DEPLOYING.md; do
    test -e "$tmp/prefix/$f" || { echo "missing $f"; exit 1; }
done
test -e "$libdir/libkvshare.a" || { echo "missing libkvshare.a"; exit 1; }
ls "$libdir"/libkvshare.so* >/dev/null || { echo "missing libkvshare.so"; exit 1; }

cat >"$tmp/hello.c" <<'C'
#include <kvshare.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    kvs_options_t opts;
    kvs_client_t *c = NULL;
    kvs_options_init(&opts);
    opts.socket_path = "/nonexistent/kvshared.sock";
    int rc = kvs_connect(&opts, &c);
    printf("kvshare %d.%d.%d: connect without a daemon: %s\n", KVS_VERSION_MAJOR,
           KVS_VERSION_MINOR, KVS_VERSION_PATCH, kvs_strerror(rc));
    kvs_close(c);
    return rc == KVS_ENOTCONN && strcmp(kvs_strerror(KVS_EPOOLFULL), "no free block in the pool") == 0
               ? 0
               : 1;
}
C
export PKG_CONFIG_PATH="$(dirname "$pc")"
# shellcheck disable=SC2046
"$cc" "$@" -o "$tmp/hello" "$tmp/hello.c" $(pkg-config --cflags --libs kvshare)
LD_LIBRARY_PATH="$libdir" "$tmp/hello"
# The static library is self-contained but for libprotobuf-c and libdl.
# shellcheck disable=SC2046
"$cc" "$@" -o "$tmp/hello_static" "$tmp/hello.c" $(pkg-config --cflags kvshare) \
    "$libdir/libkvshare.a" $(pkg-config --libs libprotobuf-c) -ldl
"$tmp/hello_static"
if ldd "$tmp/hello_static" | grep -q libkvshare; then
    echo "hello_static links libkvshare.so"; exit 1
fi
# find_package(kvshare) against the installed prefix: one program linked
# with each imported target, each run. The prefix is moved first: the
# package's paths are relative to itself.
mv "$tmp/prefix" "$tmp/moved"
mkdir "$tmp/fp"
cp "$tmp/hello.c" "$tmp/fp/hello.c"
cat >"$tmp/fp/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(kvshare_user C)
find_package(kvshare 0.2 REQUIRED)
add_executable(hello_fp hello.c)
target_link_libraries(hello_fp PRIVATE kvshare::kvshare)
add_executable(hello_fp_static hello.c)
target_link_libraries(hello_fp_static PRIVATE kvshare::kvshare_static)
CM
cmake -S "$tmp/fp" -B "$tmp/fp/build" -DCMAKE_PREFIX_PATH="$tmp/moved" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$*" >"$tmp/fp.log" 2>&1 ||
    { cat "$tmp/fp.log"; exit 1; }
cmake --build "$tmp/fp/build" >>"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; exit 1; }
"$tmp/fp/build/hello_fp"
"$tmp/fp/build/hello_fp_static"
ldd "$tmp/fp/build/hello_fp" | grep -q "libkvshare.so.1 => $tmp/moved" ||
    { echo "hello_fp does not load the installed libkvshare.so.1"; ldd "$tmp/fp/build/hello_fp"; exit 1; }
mv "$tmp/moved" "$tmp/prefix"

"$tmp/prefix/bin/kvshared" --version
"$tmp/prefix/bin/kvshared" --check-config "$tmp/prefix/share/kvshare/examples/kvshared.conf"
"$tmp/prefix/bin/kvshare" --help >/dev/null
# The Python package from its installed place (share/kvshare/python, or
# KVS_PYTHON_INSTALL_DIR), importable without PyTorch, with the engine
# plug-ins: they derive from the engines' own classes, so without an engine
# they refuse to import, naming it.
pyinit=$(find "$tmp/prefix" -path "*/kvshare/__init__.py")
test -n "$pyinit" || { echo "no Python package kvshare installed"; exit 1; }
PYTHONPATH="$(dirname "$(dirname "$pyinit")")" python3 -c "
import kvshare, kvshare.keyblocks, kvshare.tensors
for engine in ('vllm', 'sglang'):
    try:
        __import__('kvshare.' + engine)
    except ImportError as e:
        assert 'kvshare.%s needs' % engine in str(e), e
print('python package: ok')"
grep -q "ExecStart=.*kvshared --config" "$tmp/prefix/lib/systemd/system/kvshared.service"
# GPU nodes: started after the driver's daemons (fabric manager: cuInit 802).
grep -q "^After=nvidia-persistenced.service nvidia-fabricmanager.service" \
    "$tmp/prefix/lib/systemd/system/kvshared.service"
grep -q "^LimitNOFILE=" "$tmp/prefix/lib/systemd/system/kvshared.service"
# The disk tier's file lives in the unit's StateDirectory, as the example says.
grep -q "^StateDirectory=kvshare$" "$tmp/prefix/lib/systemd/system/kvshared.service"
grep -q "^# disk_tier_path = /var/lib/kvshare/tier3" "$tmp/prefix/share/kvshare/examples/kvshared.conf"
echo "install test: ok"
