#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The ABI check: compares libkvshare.so of a build with the baseline of this
# SOVERSION kept in client/abi/ (abidiff, from Debian's abigail-tools).
#
#   tools/abi-check.sh [BUILD_DIR]           check (CI, ctest test_abi)
#   tools/abi-check.sh --update [BUILD_DIR]  rewrite the baseline
#
# Any change to the exported functions or the types they reach fails, but
# for a counter appended to KVS_COUNTERS (client/abi/kvshare.abignore).
# A change that fails is either a mistake, or deliberate: then follow the
# rule in common/kvshare_version.h (bump KVS_SOVERSION if it breaks old programs) and run
# --update in the same commit. Exit status: 0 same ABI, 1 changed, 77 when
# abidiff is not installed (tools/install-deps.sh installs it).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
update=0
if [ "${1:-}" = "--update" ]; then
    update=1
    shift
fi
build=${1:-$here/build}
lib=$build/client/libkvshare.so
baseline=$here/client/abi/libkvshare.abi
suppr=$here/client/abi/kvshare.abignore

if ! command -v abidiff >/dev/null 2>&1 || ! command -v abidw >/dev/null 2>&1; then
    echo "skipped: abidiff/abidw not installed (Debian: abigail-tools)"
    exit 77
fi
test -e "$lib" || { echo "abi-check: no $lib: build first"; exit 1; }

# Locations and build paths out of the XML: it is compared, not read.
dump() {
    abidw --headers-dir "$here/client" --headers-dir "$here/common" --drop-undefined-syms --no-show-locs \
        --no-comp-dir-path --no-corpus-path --no-architecture --out-file "$2" "$1"
    sed -i -e "s|$(cd "$build" && pwd)/||g" -e "s|$here/||g" "$2"
}

if [ $update -eq 1 ]; then
    dump "$lib" "$baseline"
    echo "abi-check: wrote $baseline"
    exit 0
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-abi-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dump "$lib" "$tmp/current.abi"
if abidiff --suppressions "$suppr" --no-added-syms "$baseline" "$tmp/current.abi" \
    >"$tmp/report" 2>&1; then
    echo "abi-check: libkvshare.so.$(sed -n 's/^#define KVS_SOVERSION //p' \
        "$here/common/kvshare_version.h") matches client/abi/libkvshare.abi"
    exit 0
fi
cat "$tmp/report"
echo "abi-check: the ABI changed; see the rule in common/kvshare_version.h"
exit 1
