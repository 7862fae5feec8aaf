#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# layering.sh must fail on a tree that breaks the rule: radix/ including the
# client's header, gpu/ and disk/ including a daemon header (disk/ logs
# nothing: its callers do), and a header nobody holds.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-layering-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/common" "$tmp/radix" "$tmp/gpu" "$tmp/disk" "$tmp/client" "$tmp/daemon"
echo '#include "kvshare_status.h"' >"$tmp/common/kvshare_status.h"
echo '#include "kvshare_status.h"' >"$tmp/client/kvshare.h"
echo '#include "kvshare_status.h"' >"$tmp/daemon/server.h"
printf '#include "kvshare_status.h"\n' >"$tmp/radix/good.c"
printf '#include "kvshare_status.h"\n' >"$tmp/disk/good.c"
if ! sh "$here/layering.sh" "$tmp" >"$tmp/out"; then
    echo "FAIL: a tree that follows the rule was refused:"
    cat "$tmp/out"
    exit 1
fi
printf '#include "kvshare.h"\n' >"$tmp/radix/radix.c"
printf '#include "server.h"\n' >"$tmp/gpu/pool.c"
printf '#include "server.h"\n' >"$tmp/disk/disk.c"
printf '#include "nowhere.h"\n' >"$tmp/daemon/main.c"
if sh "$here/layering.sh" "$tmp" >"$tmp/out"; then
    echo "FAIL: layering.sh accepted radix/, gpu/ and disk/ including client/ and daemon/ headers"
    exit 1
fi
for want in 'radix/radix.c: includes "kvshare.h" from client/' \
            'gpu/pool.c: includes "server.h" from daemon/' \
            'disk/disk.c: includes "server.h" from daemon/' \
            'daemon/main.c: includes "nowhere.h", which no folder holds'; do
    grep -qF "$want" "$tmp/out" || { echo "FAIL: no line '$want' in:"; cat "$tmp/out"; exit 1; }
done
echo "layering_catches: ok"
