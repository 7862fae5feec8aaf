#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Calls point downward too, read from the objects: inside daemon/ a
# function of one floor may call functions defined on its own floor or
# below it,
#
#     daemon (kvshared.c, the assembly) -> net -> rpc -> store -> core
#
# never above. tests/layering.sh reads the includes, which cannot see a call
# to a function whose header lives on a lower floor than its code. Here nm
# lists, for each object of the daemon's library, the functions it calls
# (U) and the ones it defines (T): a call from floor F to a function
# defined on a higher floor is an upward call, and there may be none. A
# lower floor that must reach up does so through hooks the assembly sets
# (session_hooks_t, server_t.stop), which are no calls to nm.
#
# Usage: layering_calls.sh BUILD_DIR
# (the objects under BUILD_DIR/daemon/CMakeFiles/kvs_daemon.dir: one folder
# per floor, the assembly's objects at the top)
set -eu
build=$1
objs=$build/daemon/CMakeFiles/kvs_daemon.dir
NM=${NM:-nm}

if [ ! -d "$objs" ]; then
    echo "layering_calls: no objects under $objs (build the daemon first)" >&2
    exit 1
fi

floors="core store rpc net daemon" # lowest first

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The library's objects: those its link line names (so that objects left
# in the build folder by a file since moved or removed do not count), else
# every object in the floors' folders.
if [ -f "$objs/link.txt" ]; then
    tr ' ' '\n' <"$objs/link.txt" | sed -n 's|^CMakeFiles/kvs_daemon.dir/||p' | grep '\.o$' >"$tmp/objs" || :
else
    (cd "$objs" && find . -name '*.o' | sed 's|^\./||') >"$tmp/objs"
fi

# defs: "function floor object"; uses: "function floor object"
: >"$tmp/defs.u"
while read -r rel; do
    case $rel in
    */*) floor=${rel%%/*} ;;
    *) floor=daemon ;;
    esac
    case " $floors " in
    *" $floor "*) ;;
    *)
        echo "layering_calls: $rel is on no floor ($floors)" >&2
        exit 1
        ;;
    esac
    obj=$floor/$(basename "$rel" .c.o)
    "$NM" "$objs/$rel" | awk -v f="$floor" -v ob="$obj" -v defs="$tmp/defs.u" \
        '$2 == "T" { print $3, f, ob >>defs } $1 == "U" { print $2, f, ob }'
done <"$tmp/objs" >"$tmp/uses"
sort "$tmp/defs.u" >"$tmp/defs"
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

if [ -s "$tmp/found" ]; then
    echo "layering_calls: $(wc -l <"$tmp/found") upward call(s) (a floor calls a floor above it):"
    sed 's/^/  /' "$tmp/found"
    exit 1
fi
echo "layering_calls: $(awk '{ print $3 }' "$tmp/uses" | sort -u | wc -l) objects, $(wc -l <"$tmp/defs") functions, no upward call"
