#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Calls point downward too, read from the objects: inside daemon/ a
# function of one floor may call functions defined on its own floor or
# below it,
#
#     net -> rpc -> store -> core
#
# never above. tests/layering.sh reads the includes, which cannot see a call
# to a function whose header lives on a lower floor than its code
# (core/session.h declares what net/session.c defines). Here nm lists, for
# each object of the daemon's library, the functions it calls (U) and the
# ones it defines (T): a call from floor F to a function defined on a
# higher floor is an upward call.
#
# The upward calls the daemon still makes are listed in
# tests/layering_calls.known, one "caller-object -> function (callee-object)"
# a line. The check fails on a call that is not listed (a new one) and on a
# listed one that is gone (take it off the list: the list only shrinks).
#
# Usage: layering_calls.sh BUILD_DIR [SOURCE_ROOT]
# (KVS_LAYERING_KNOWN names another list: the suite's check that it fails.)
set -eu
build=$1
root=${2:-$(dirname "$0")/..}
objs=$build/daemon/CMakeFiles/kvs_daemon.dir
known=${KVS_LAYERING_KNOWN:-$root/tests/layering_calls.known}
NM=${NM:-nm}

if [ ! -d "$objs" ]; then
    echo "layering_calls: no objects under $objs (build the daemon first)" >&2
    exit 1
fi

floors="core store rpc net" # lowest first

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# defs: "function floor object"; uses: "function floor object"
for floor in $floors; do
    for o in "$objs/$floor"/*.o; do
        [ -e "$o" ] || continue
        obj=$floor/$(basename "$o" .c.o)
        "$NM" "$o" | awk -v f="$floor" -v ob="$obj" \
            '$2 == "T" { print $3, f, ob >>"'"$tmp/defs.u"'" } $1 == "U" { print $2, f, ob }'
    done
done >"$tmp/uses"
sort "$tmp/defs.u" >"$tmp/defs" 2>/dev/null || :
if [ ! -s "$tmp/defs" ]; then
    echo "layering_calls: nm found no function in the daemon's objects" >&2
    exit 1
fi

# A call to a function defined on a higher floor than the caller's.
awk -v floors="$floors" '
    BEGIN { n = split(floors, f, " "); for (i = 1; i <= n; i++) rank[f[i]] = i }
    NR == FNR { floor[$1] = $2; obj[$1] = $3; next }
    ($1 in floor) && rank[floor[$1]] > rank[$2] { print $3 " -> " $1 " (" obj[$1] ")" }
' "$tmp/defs" "$tmp/uses" | sort -u >"$tmp/found"

grep -v '^#' "$known" | sed '/^$/d' | sort -u >"$tmp/known"
status=0
new=$(comm -23 "$tmp/found" "$tmp/known")
gone=$(comm -13 "$tmp/found" "$tmp/known")
if [ -n "$new" ]; then
    echo "layering_calls: upward calls not in tests/layering_calls.known (a floor calls a floor above it):"
    echo "$new" | sed 's/^/  /'
    status=1
fi
if [ -n "$gone" ]; then
    echo "layering_calls: listed upward calls that are gone: take them off tests/layering_calls.known:"
    echo "$gone" | sed 's/^/  /'
    status=1
fi
[ $status -ne 0 ] || echo "layering_calls: $(wc -l <"$tmp/found") upward calls, as listed"
exit $status
