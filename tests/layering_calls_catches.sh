#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/layering_calls.sh fails when it should: on a tree of objects where
# a lower floor calls a function of a higher one (core -> net, and net ->
# the assembly), and passes on a tree whose calls point down.
# Usage: layering_calls_catches.sh SOURCE_ROOT
set -u
root=$1
check=$root/tests/layering_calls.sh
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# obj FLOOR NAME SOURCE TREE: one object of a fake daemon's library
obj() {
    dir=$tmp/$4/daemon/CMakeFiles/kvs_daemon.dir/$1
    [ "$1" = daemon ] && dir=$tmp/$4/daemon/CMakeFiles/kvs_daemon.dir
    mkdir -p "$dir"
    printf '%s\n' "$3" >"$tmp/src.c"
    if ! "$CC" -c -o "$dir/$2.c.o" "$tmp/src.c"; then
        echo "layering_calls_catches: $CC cannot build the test objects"
        exit 1
    fi
}

# down: the assembly calls net, net calls core.
obj core log 'int log_line(int x) { return x + 1; }' down
obj net session 'int log_line(int); int session_turn(int x) { return log_line(x); }' down
obj daemon kvshared 'int session_turn(int); int server_open(int x) { return session_turn(x); }' down
if ! sh "$check" "$tmp/down" >"$tmp/out"; then
    echo "layering_calls_catches: calls pointing down failed the check:"
    cat "$tmp/out"
    fail=1
fi

# up: core calls net.
obj core log 'int session_turn(int); int log_line(int x) { return session_turn(x); }' up
obj net session 'int session_turn(int x) { return x; }' up
if sh "$check" "$tmp/up" >"$tmp/out" || ! grep -q 'core/log -> session_turn (net/session)' "$tmp/out"; then
    echo "layering_calls_catches: core calling net passed, or was not named:"
    cat "$tmp/out"
    fail=1
fi

# up to the assembly: net calls server_shutdown.
obj net session 'void server_shutdown(void); void session_turn(void) { server_shutdown(); }' top
obj daemon kvshared 'void server_shutdown(void) {}' top
if sh "$check" "$tmp/top" >"$tmp/out" || ! grep -q 'net/session -> server_shutdown (daemon/kvshared)' "$tmp/out"; then
    echo "layering_calls_catches: net calling the assembly passed, or was not named:"
    cat "$tmp/out"
    fail=1
fi

[ $fail -eq 0 ] && echo "layering_calls_catches: calls down pass; core -> net and net -> the assembly fail"
exit $fail
