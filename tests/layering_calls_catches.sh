#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/layering_calls.sh fails when it should: with one listed upward call
# left off the list (a new call) and with a call listed that the objects do
# not make (one that is gone), and passes with the list as it is.
# Usage: layering_calls_catches.sh BUILD_DIR SOURCE_ROOT
set -u
build=$1
root=$2
check=$root/tests/layering_calls.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
if ! sh "$check" "$build" "$root" >/dev/null; then
    echo "layering_calls_catches: the check fails on the tree as it is"
    fail=1
fi
grep -v '^#' "$root/tests/layering_calls.known" | sed '/^$/d' | sed 1d >"$tmp/short"
if KVS_LAYERING_KNOWN=$tmp/short sh "$check" "$build" "$root" >/dev/null; then
    echo "layering_calls_catches: a call left off the list passed"
    fail=1
fi
{ cat "$root/tests/layering_calls.known"; echo "core/log -> no_such_function (net/server)"; } >"$tmp/long"
if KVS_LAYERING_KNOWN=$tmp/long sh "$check" "$build" "$root" >/dev/null; then
    echo "layering_calls_catches: a listed call that is gone passed"
    fail=1
fi
[ $fail -eq 0 ] && echo "layering_calls_catches: a new upward call and a stale entry both fail the check"
exit $fail
