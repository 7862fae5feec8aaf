#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Fails when a C source or header of the repo differs from .clang-format.
# With --fix, rewrites them instead.
set -eu
cd "$(dirname "$0")/.."
files=$(git ls-files '*.c' '*.h')
[ -z "$files" ] && exit 0
if [ "${1:-}" = "--fix" ]; then
    # shellcheck disable=SC2086
    clang-format -i $files
else
    # shellcheck disable=SC2086
    clang-format --dry-run --Werror $files
fi
