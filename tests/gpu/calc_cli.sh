#!/bin/sh
# `kvshare calc` end to end: the published Llama-3.1-70B figures, JSON,
# explicit geometry, and usage errors. $1: the kvshare binary.
set -u
KVSHARE=$1
fail=0

# expect NAME PATTERN OUTPUT: OUTPUT has a line matching the extended regex.
expect() {
    if printf '%s\n' "$3" | grep -Eq -- "$2"; then
        echo "ok   $1"
    else
        echo "FAIL $1: no line matches /$2/ in:"
        printf '%s\n' "$3"
        fail=1
    fi
}

out=$("$KVSHARE" calc --model llama-3.1-70b --context 4k,32k,128k) || fail=1
expect "70B bf16 320 KiB per token" '^per token +327680 B/token \(320 KiB\)$' "$out"
expect "70B bf16 5 MiB block" '^per block +5242880 B \(5 MiB\)$' "$out"
expect "70B bf16 4k 1.3 GB" '^4k +4096 +1\.34 GB +256$' "$out"
expect "70B bf16 32k 10.7 GB" '^32k +32768 +10\.7 GB +2048$' "$out"
expect "70B bf16 128k 42.9 GB" '^128k +131072 +42\.9 GB +8192$' "$out"

out=$("$KVSHARE" calc --model llama-3.1-70b --dtype fp8 --budget 70GB --context 4k,32k,128k) ||
    fail=1
expect "70B fp8 budget 26702 blocks" '^budget +70000000000 B .*: 26702 blocks, 427232 tokens$' "$out"
expect "70B fp8 4k: 104 sequences" '^4k +4096 +0\.67 GB +256 +104$' "$out"
expect "70B fp8 32k: 13 sequences" '^32k +32768 +5\.37 GB +2048 +13$' "$out"
expect "70B fp8 128k 21.5 GB: 3 sequences" '^128k +131072 +21\.5 GB +8192 +3$' "$out"

out=$("$KVSHARE" calc --model llama-3.1-70b --dtype fp8 --budget 70GB --context 128k --json) ||
    fail=1
expect "json" '^\{"model":"llama-3.1-70b","layers":80,"kv_heads":8,"head_dim":128,"dtype":"fp8","block_tokens":16,"bytes_per_token":163840,"block_bytes":2621440,"budget_bytes":70000000000,"blocks":26702,"tokens":427232,"contexts":\[\{"tokens":131072,"blocks":8192,"kv_bytes":21474836480,"sequences":3\}\]\}$' "$out"

# explicit geometry = the preset; an override wins over the preset
out=$("$KVSHARE" calc --layers 80 --kv-heads 8 --head-dim 128 --dtype bf16 --context 1000) ||
    fail=1
expect "explicit geometry" '^per token +327680 B/token' "$out"
expect "partial block counts whole" '^1000 +1000 +0\.33 GB +63$' "$out"
out=$("$KVSHARE" calc --layers 40 --model llama-3.1-70b --block-tokens 32 --budget 64GiB) ||
    fail=1
expect "override after preset" '^model +llama-3.1-70b: 40 layers, 8 kv_heads, head_dim 128, bf16, 32-token blocks$' "$out"
expect "GiB budget" '^budget +68719476736 B' "$out"

out=$("$KVSHARE" calc --list-models) || fail=1
expect "list models" '^qwen2\.5-7b +28 layers +4 kv_heads +128 head_dim +57344 B/token' "$out"

# usage errors: exit 2 and a message
for args in "--model nope" "--layers 8" "--model llama-3.1-8b --budget lots" \
    "--model llama-3.1-8b --context 0" "--model llama-3.1-8b --dtype int4" "--bogus" \
    "--model llama-3.1-8b extra"; do
    # shellcheck disable=SC2086
    err=$("$KVSHARE" calc $args 2>&1 >/dev/null)
    rc=$?
    if [ "$rc" -eq 2 ] && [ -n "$err" ]; then
        echo "ok   usage error: $args"
    else
        echo "FAIL usage error: $args: exit $rc, message '$err'"
        fail=1
    fi
done
if "$KVSHARE" nosuchcommand >/dev/null 2>&1; then rc=0; else rc=$?; fi
if [ "$rc" -eq 2 ]; then
    echo "ok   unknown command"
else
    echo "FAIL unknown command: exit $rc"
    fail=1
fi

exit $fail
