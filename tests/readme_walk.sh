#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# README's walk of one request ("A request, through the source") names
# real functions on the real path: every "`path/file.c` `function`" pair in
# it is a function defined in that file (its definition starts a line).
# Usage: readme_walk.sh [SOURCE_ROOT]
set -eu
root=${1:-$(dirname "$0")/..}
cd "$root"
walk=$(sed -n '/^### A request, through the source/,/^Adding an RPC/p' README.md)
if [ -z "$walk" ]; then
    echo "readme_walk: README.md has no section \"A request, through the source\""
    exit 1
fi
pairs=$(printf '%s\n' "$walk" | tr '\n' ' ' |
    grep -oE '`[a-z]+(/[a-z_0-9]+)+\.c` +`[a-z_][a-z_0-9]*`' | tr -d '`' | tr -s ' ' || true)
if [ -z "$pairs" ]; then
    echo "readme_walk: no \"\`file.c\` \`function\`\" pair in the walk"
    exit 1
fi
status=0
n=0
printf '%s\n' "$pairs" | {
    while read -r file fn; do
        n=$((n + 1))
        if [ ! -f "$file" ]; then
            echo "readme_walk: $file (for $fn) does not exist"
            status=1
        elif ! grep -qE "^([a-z_].*[ *])?$fn\(" "$file"; then
            echo "readme_walk: $fn is not defined in $file"
            status=1
        fi
    done
    [ $status -ne 0 ] || echo "readme_walk: $n functions, each defined in the file named"
    exit $status
}
