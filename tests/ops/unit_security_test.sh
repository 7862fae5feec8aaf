#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The systemd unit's hardening: `systemd-analyze security --offline=yes`
# (systemd 252 and later; no systemd needed as PID 1) rates the configured
# kvshared.service at most MAX (3.0 by default; Redis's unit rates 1.2), and
# the hardening keeps what the daemon needs: its socket and state
# directories, AF_UNIX (SCM_RIGHTS) and AF_INET (metrics), the NVIDIA devices.
# Usage: unit_security_test.sh UNIT [MAX]
# Exit 77 (skipped, with the reason) without a systemd-analyze that knows
# --offline.
set -eu
unit=$1
max=${2:-3.0}
fail() {
    echo "unit_security_test: $*" >&2
    exit 1
}
[ -f "$unit" ] || fail "no unit $unit (configured by daemon/CMakeLists.txt)"
for want in "^RuntimeDirectory=kvshare$" "^StateDirectory=kvshare$" \
    "^RestrictAddressFamilies=.*AF_UNIX" "^RestrictAddressFamilies=.*AF_INET " \
    "^DeviceAllow=/dev/nvidiactl rw$" "^DeviceAllow=/dev/nvidia-uvm rw$" \
    "^DeviceAllow=char-nvidia-frontend rw$" "^LimitMEMLOCK=infinity$"; do
    grep -q "$want" "$unit" || fail "$unit lost '$want', which the daemon needs"
done
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skipped: systemd-analyze not installed (Debian: systemd)"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvs-unit-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The rating names the unit by its file name.
cp "$unit" "$tmp/kvshared.service"
if ! systemd-analyze security --offline=yes "$tmp/kvshared.service" >"$tmp/out" 2>&1; then
    if grep -q "offline" "$tmp/out"; then
        echo "skipped: this systemd-analyze has no --offline (systemd 252 or later):"
        cat "$tmp/out"
        exit 77
    fi
    cat "$tmp/out"
    fail "systemd-analyze security failed"
fi
level=$(sed -n 's/.*Overall exposure level for kvshared.service: \([0-9.]*\).*/\1/p' "$tmp/out")
[ -n "$level" ] || { cat "$tmp/out"; fail "no overall exposure level in the output"; }
if awk -v l="$level" -v m="$max" 'BEGIN { exit !(l > m) }'; then
    grep "✗" "$tmp/out" || true
    fail "exposure level $level is above $max"
fi
echo "unit_security_test: kvshared.service exposure level $level (at most $max)"
