#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Fails when a source file of the repo lacks the SPDX line in its first three
# lines: C sources and headers, Python, shell, CMake, the .proto and the
# linker map. With --fix, adds the line where it is missing.
set -eu
cd "$(dirname "$0")/.."
spdx="SPDX-License-Identifier: Apache-2.0"
missing=0
for f in $(git ls-files '*.c' '*.h' '*.cu' '*.py' '*.sh' '*.proto' '*.cmake' '*.in' \
    '*.map' 'CMakeLists.txt' '*/CMakeLists.txt' '.ci/run'); do
    [ -f "$f" ] || continue
    head -n 3 "$f" | grep -q "$spdx" && continue
    if [ "${1:-}" != "--fix" ]; then
        echo "no license line: $f"
        missing=$((missing + 1))
        continue
    fi
    case "$f" in
    *.c | *.h | *.cu | *.proto) line="/* $spdx */" ;;
    *.map) line="/* $spdx */" ;;
    *) line="# $spdx" ;;
    esac
    tmp="$f.spdx.$$"
    if head -n 1 "$f" | grep -q '^#!'; then
        { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$tmp"
    else
        { echo "$line"; cat "$f"; } >"$tmp"
    fi
    chmod --reference="$f" "$tmp"
    mv "$tmp" "$f"
done
if [ "$missing" -gt 0 ]; then
    echo "$missing files lack '$spdx' (tools/check-license.sh --fix adds it)"
    exit 1
fi
