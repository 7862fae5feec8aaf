#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The include graph points only downward:
#
#     tools  ->  client  ->  gpu, proto  ->  common
#     daemon ->  radix, gpu, disk, proto  ->  common
#
# (tools/ may use radix/ and disk/ too: kvshare-bench measures them alone),
# and inside daemon/, the way a request travels:
#
#     daemon (main.c) -> net -> rpc -> store -> core
#
# Each folder below may include (with "...") headers of the folders listed
# after it, and nothing else; tests/ may include anything. tests/support is
# a folder of its own: kvshare-bench (tools/) starts its daemon with the
# tests' launcher, and the launcher uses only common/. Fails, naming the
# file and the header, when a source includes a header of a folder it may not
# use, or a header that no folder holds.
#
# Usage: layering.sh [SOURCE_ROOT]   (default: the repository this script is in)
set -eu
root=${1:-$(dirname "$0")/..}
cd "$root"

allowed() {
    case $1 in
    common) echo "common" ;;
    radix) echo "radix common" ;;
    gpu) echo "gpu common" ;;
    disk) echo "disk common" ;;
    proto) echo "proto common" ;;
    daemon) echo "daemon daemon/net daemon/rpc daemon/store daemon/core radix gpu disk proto common" ;;
    daemon/net) echo "daemon/net daemon/rpc daemon/store daemon/core radix gpu disk proto common" ;;
    daemon/rpc) echo "daemon/rpc daemon/store daemon/core radix gpu disk proto common" ;;
    daemon/store) echo "daemon/store daemon/core radix gpu disk proto common" ;;
    daemon/core) echo "daemon/core radix gpu disk proto common" ;;
    client) echo "client gpu proto common" ;;
    tools) echo "tools client radix gpu disk proto common tests/support" ;;
    tests/support) echo "tests/support proto common" ;;
    esac
}

folders="common radix gpu disk proto daemon daemon/net daemon/rpc daemon/store daemon/core client tools
tests/support"
existing=""
for f in $folders; do
    [ -d "$f" ] && existing="$existing $f"
done

# header basename -> folder; the generated protocol header belongs to proto/.
map=$(mktemp)
trap 'rm -f "$map"' EXIT
echo "kvshare.pb-c.h proto" >"$map"
# shellcheck disable=SC2086
find $existing -name '*.h' | while read -r h; do
    case $h in
    tests/support/*) echo "$(basename "$h") tests/support" ;;
    daemon/*/*) echo "$(basename "$h") $(dirname "$h")" ;;
    *) echo "$(basename "$h") ${h%%/*}" ;;
    esac
done >>"$map"

status=0
checked=0
for folder in $existing; do
    ok=$(allowed "$folder")
    # A folder's own files; daemon/ alone is main.c (its subfolders are
    # folders of their own).
    depth=""
    [ "$folder" = daemon ] && depth="-maxdepth 1"
    # shellcheck disable=SC2086
    for src in $(find "$folder" $depth \( -name '*.c' -o -name '*.h' \) | sort); do
        checked=$((checked + 1))
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$src"); do
            owner=$(awk -v h="$(basename "$inc")" '$1 == h { print $2; exit }' "$map")
            if [ -z "$owner" ]; then
                echo "$src: includes \"$inc\", which no folder holds"
                status=1
                continue
            fi
            case " $ok " in
            *" $owner "*) ;;
            # The loop's wake-up (libuv only): kvshare-bench measures it
            # against uv_async_t.
            *) case "$folder:$(basename "$inc")" in
               tools:loop_wake.h) continue ;;
               esac
               # kvshare-bench devices measures the daemon's own request
               # path in its process (the daemon assembled, kvshared.h, and
               # a session without a socket, net/session_io.h), next to the
               # same Lookups over the socket.
               case "$src:$owner" in
               tools/bench/bench_devices.c:daemon*) continue ;;
               # The tests' client of the test daemon (Check suites only);
               # the launcher that kvshare-bench uses stays below client/.
               tests/support/harness_client.[ch]:client) continue ;;
               # The suites' server on their own loop (Check suites only,
               # kvs_test_server); nothing in tools/ links it.
               tests/support/test_server.[ch]:daemon*) continue ;;
               esac ;;
            esac
            case " $ok " in
            *" $owner "*) ;;
            *)
                echo "$src: includes \"$inc\" from $owner/; $folder/ may use only: $ok"
                status=1
                ;;
            esac
        done
    done
done
if [ "$status" -eq 0 ]; then
    echo "layering: $checked files, every include points downward"
fi
exit "$status"
