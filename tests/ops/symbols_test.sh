#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The library exports its public prefix only: every defined global symbol
# of libkvshare.so and of the installed libkvshare.a starts with kvs_, so
# nothing internal (pool_*, backend_*, geometry_*, kvshare__*) can collide
# with a program's own symbols. Usage: symbols_test.sh LIBKVSHARE.so LIBKVSHARE.a
set -eu
so=$1
archive=$2
fail=0
for lib in "$so" "$archive"; do
    test -s "$lib" || { echo "missing $lib"; exit 1; }
    # nm prints "ADDR TYPE NAME" for defined symbols, "FILE:" for members.
    syms=$(nm -g --defined-only "$lib" | awk 'NF == 3 { print $3 }')
    test -n "$syms" || { echo "$lib: no defined global symbol"; exit 1; }
    bad=$(printf '%s\n' "$syms" | grep -v '^kvs_' || true)
    if [ -n "$bad" ]; then
        echo "$lib exports symbols outside kvs_*:"
        printf '  %s\n' $bad
        fail=1
    fi
    # The public API is there (one function of each family).
    for f in kvs_connect kvs_stats kvs_tree kvs_counter_name kvs_strerror; do
        printf '%s\n' "$syms" | grep -qx "$f" || { echo "$lib: $f not exported"; fail=1; }
    done
    echo "$lib: $(printf '%s\n' "$syms" | wc -l) symbols, all kvs_*"
done
exit $fail
