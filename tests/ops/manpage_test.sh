#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The man pages generated at build time (man/manpage.c) format without a
# groff warning, kvshared(8) names every flag of `kvshared --help` and
# kvshare(1) every command of `kvshare help`.
# Usage: manpage_test.sh MANDIR KVSHARED KVSHARE. Exit 77 (skipped) without man.
set -eu
mandir=$1
kvshared=$2
kvshare=$3
fail() {
    echo "manpage_test: $*" >&2
    exit 1
}
command -v man >/dev/null || { echo "skipped: no man (Debian: man-db)"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-man-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for page in kvshared.8 kvshare.1; do
    MANWIDTH=80 man --warnings -E UTF-8 -l "$mandir/$page" >"$tmp/$page.txt" 2>"$tmp/$page.err"
    [ -s "$tmp/$page.err" ] && { cat "$tmp/$page.err"; fail "$page: groff warnings (above)"; }
    grep -q "SEE ALSO" "$tmp/$page.txt" || fail "$page: no SEE ALSO section"
done
"$kvshared" --help | grep -o -- "--[a-z][a-z0-9-]*" | sort -u >"$tmp/flags"
[ -s "$tmp/flags" ] || fail "kvshared --help names no flag"
while read -r flag; do
    grep -q -- "$flag" "$tmp/kvshared.8.txt" || fail "kvshared(8) does not name $flag"
done <"$tmp/flags"
"$kvshare" help | sed -n 's/^  \([a-z]*\) .*/\1/p' >"$tmp/commands"
[ -s "$tmp/commands" ] || fail "kvshare help names no command"
while read -r cmd; do
    grep -q "^   $cmd\$" "$tmp/kvshare.1.txt" || fail "kvshare(1) has no section for $cmd"
done <"$tmp/commands"
echo "man pages: $(wc -l <"$tmp/flags") flags, $(wc -l <"$tmp/commands") commands, no warnings"
