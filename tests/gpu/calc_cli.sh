#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `kvshare calc` end to end: the published Llama-3.1-70B figures, the budget
# derived from GPU memory, users and price, MLA models, JSON, explicit
# geometry, and usage errors. $1: the kvshare binary.
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
expect "json" '^\{"model":"llama-3.1-70b","attention":"mha","layers":80,"kv_heads":8,"head_dim":128,"kv_lora_rank":0,"rope_head_dim":0,"dtype":"fp8","block_tokens":16,"bytes_per_token":163840,"block_bytes":2621440,"budget_source":"budget","budget_bytes":70000000000,"blocks":26702,"tokens":427232,"contexts":\[\{"tokens":131072,"blocks":8192,"kv_bytes":21474836480,"sequences":3\}\]\}$' "$out"

# The operator's question: 2 H100s (2x80GB), Llama-3.1-70B in FP8 (70 GB of
# weights), utilization 0.9, 5 GB overhead, $6/hour for the pair, 16 users.
# 160 GB x 0.9 - 70 - 5 = 69 GB of KV ("~70 GB"): 26321 blocks, 421136 live
# tokens ("~430k"); 102 / 12 / 3 users at 4k / 32k / 128k ("~105 / ~13 / ~3",
# quoted from 70 GB and a rounded per-user size); 16 users need 10.7 GB at 4k
# (fits), 85.9 GB at 32k (does not), 344 GB at 128k; a 4k user costs $0.059
# an hour, a 128k user $2.00.
node="--model llama-3.1-70b --dtype fp8 --gpu-memory 2x80GB --weights 70GB --overhead 5GB"
# shellcheck disable=SC2086
out=$("$KVSHARE" calc $node --users 16 --price-per-hour 6) || fail=1
expect "derived: gpu memory" '^gpu memory +160000000000 B \(2 x 80\.0 GB = 160 GB\) x 0\.9 utilization = 144 GB$' "$out"
expect "derived: weights" '^weights +70000000000 B \(70\.0 GB\)$' "$out"
expect "derived: overhead" '^overhead +5000000000 B \(5\.00 GB\)$' "$out"
expect "derived: 69 GB budget" '^budget +69000000000 B \(69\.0 GB, 64\.26 GiB\): 26321 blocks, 421136 tokens$' "$out"
expect "derived: the derivation" '^ += 144 GB - 70\.0 GB weights - 5\.00 GB overhead$' "$out"
expect "price line" '^price +\$6\.00 per hour for the node$' "$out"
expect "4k: 102 users, 16 fit, cents" '^4k +4096 +0\.67 GB +256 +102 +10\.7 GB +yes +\$0\.059$' "$out"
expect "32k: 12 users, 16 do not fit" '^32k +32768 +5\.37 GB +2048 +12 +85\.9 GB +no +\$0\.50$' "$out"
expect "128k: 3 users, dollars" '^128k +131072 +21\.5 GB +8192 +3 +344 GB +no +\$2\.00$' "$out"

# the same node as a plain total, and --utilization spelled out
out=$("$KVSHARE" calc --model llama-3.1-70b --dtype fp8 --gpu-memory 160GB --utilization 0.9 \
    --weights 70GB --overhead 5GB --context 4k) || fail=1
expect "160GB total" '^gpu memory +160000000000 B \(160 GB\) x 0\.9 utilization = 144 GB$' "$out"
expect "160GB total: same budget" '^budget +69000000000 B ' "$out"

# --budget overrides the derivation, which is still shown
# shellcheck disable=SC2086
out=$("$KVSHARE" calc $node --budget 70GB --context 4k) || fail=1
expect "budget overrides" '^budget +70000000000 B .*: 26702 blocks, 427232 tokens$' "$out"
expect "override says so" '^ +given by --budget; the GPUs would leave 144 GB - 70\.0 GB weights - 5\.00 GB overhead = 69\.0 GB$' "$out"

# shellcheck disable=SC2086
out=$("$KVSHARE" calc $node --users 16 --price-per-hour 6 --context 4k,128k --json) || fail=1
expect "json: derivation, users, price" '^\{"model":"llama-3.1-70b","attention":"mha","layers":80,"kv_heads":8,"head_dim":128,"kv_lora_rank":0,"rope_head_dim":0,"dtype":"fp8","block_tokens":16,"bytes_per_token":163840,"block_bytes":2621440,"gpus":2,"gpu_memory_bytes":160000000000,"utilization":0\.9,"usable_bytes":144000000000,"weights_bytes":70000000000,"overhead_bytes":5000000000,"derived_budget_bytes":69000000000,"budget_source":"gpu_memory","budget_bytes":69000000000,"blocks":26321,"tokens":421136,"users":16,"price_per_hour":6,"contexts":\[\{"tokens":4096,"blocks":256,"kv_bytes":671088640,"sequences":102,"users_kv_bytes":10737418240,"users_fit":true,"price_per_user_hour":0\.0588235\},\{"tokens":131072,"blocks":8192,"kv_bytes":21474836480,"sequences":3,"users_kv_bytes":343597383680,"users_fit":false,"price_per_user_hour":2\}\]\}$' "$out"

# users without a budget: the KV they need, no verdict; a price where no user fits
out=$("$KVSHARE" calc --model llama-3.1-8b --users 4 --context 128k) || fail=1
expect "users without budget" '^128k +131072 +17\.2 GB +8192 +68\.7 GB$' "$out"
out=$("$KVSHARE" calc --model llama-3.1-70b --budget 10GB --price-per-hour 6 --context 128k --json) ||
    fail=1
expect "no user fits: null price" '"sequences":0,"price_per_user_hour":null\}' "$out"

# MLA: DeepSeek-V3 keeps one latent of 512 + 64 per token and layer, no K/V:
# 61 x 576 x 1 B = 35136 B/token in FP8, 4.6 GB for a 128k context.
out=$("$KVSHARE" calc --model deepseek-v3 --dtype fp8 --budget 100GB --context 128k) || fail=1
expect "mla model line" '^model +deepseek-v3: 61 layers, MLA kv_lora_rank 512 \+ rope_head_dim 64, fp8, 16-token blocks$' "$out"
expect "mla per token" '^per token +35136 B/token \(34\.31 KiB\)$' "$out"
expect "mla 128k" '^128k +131072 +4\.61 GB +8192 +21$' "$out"
out=$("$KVSHARE" calc --model deepseek-v2-lite --context 4k --json) || fail=1
expect "mla json" '^\{"model":"deepseek-v2-lite","attention":"mla","layers":27,"kv_heads":0,"head_dim":0,"kv_lora_rank":512,"rope_head_dim":64,"dtype":"bf16","block_tokens":16,"bytes_per_token":31104,"block_bytes":497664,' "$out"
out=$("$KVSHARE" calc --layers 61 --kv-lora-rank 512 --rope-head-dim 64 --context 4k) || fail=1
expect "explicit mla = preset" '^per token +70272 B/token' "$out"
out=$("$KVSHARE" calc --model llama-3.1-8b --kv-lora-rank 256 --context 4k) || fail=1
expect "kv-lora-rank turns a preset into MLA" '^model +llama-3\.1-8b: 32 layers, MLA kv_lora_rank 256 \+ rope_head_dim 0, bf16' "$out"

# explicit geometry = the preset; an override wins over the preset
out=$("$KVSHARE" calc --layers 80 --kv-heads 8 --head-dim 128 --dtype bf16 --context 1000) ||
    fail=1
expect "explicit geometry" '^per token +327680 B/token' "$out"
expect "partial block counts whole" '^1000 +1000 +0\.33 GB +63$' "$out"
out=$("$KVSHARE" calc --layers 40 --model llama-3.1-70b --block-tokens 32 --budget 64GiB) ||
    fail=1
expect "override after preset" '^model +llama-3.1-70b: 40 layers, 8 kv_heads, head_dim 128, bf16, 32-token blocks$' "$out"
expect "GiB budget" '^budget +68719476736 B' "$out"

# repeated --context flags add up (none is dropped), in the order given
out=$("$KVSHARE" calc --model llama-3.1-70b --context 4096 --context 32768,1k) || fail=1
expect "repeated --context: first" '^4096 +4096 +1\.34 GB +256$' "$out"
expect "repeated --context: second" '^32768 +32768 +10\.7 GB +2048$' "$out"
expect "repeated --context: third" '^1k +1024 +0\.34 GB +64$' "$out"
if [ "$(printf '%s\n' "$out" | grep -Ec '^(4096|32768|1k) ')" -ne 3 ]; then
    echo "FAIL repeated --context: not exactly three rows in:"
    printf '%s\n' "$out"
    fail=1
fi

out=$("$KVSHARE" calc --list-models) || fail=1
expect "list models" '^qwen2\.5-7b +28 layers +4 kv_heads +128 head_dim +57344 B/token' "$out"
expect "list mla models" '^deepseek-v2-lite +27 layers MLA +512 kv_lora_rank +64 rope_head_dim +31104 B/token' "$out"

# --tp: one kvshared for a tensor-parallel group. 8 GPUs of 80 GB, 70B in
# FP8: 640 x 0.9 - 70 - 5 = 501 GB for the group, 62.6 GB per device; a rank
# holds 1 of the 8 KV heads: 20 KiB per token, 320 KiB per block, so each
# device's pool holds 191116 blocks; a sequence's KV over the group is the
# model's (0.67 GB at 4k), and 746 of them fit.
out=$("$KVSHARE" calc --model llama-3.1-70b --dtype fp8 --gpu-memory 8x80GB --weights 70GB \
    --overhead 5GB --tp 8) || fail=1
expect "tp 8: per rank" '^per rank +tp 8: 1 kv_heads, 20480 B/token \(20 KiB\), 327680 B per block \(320 KiB\)$' "$out"
expect "tp 8: kvshared flags" '^kvshared +--devices 0-7 --layers 80 --kv-heads 1 --head-dim 128 --dtype fp8 --block-tokens 16$' "$out"
expect "tp 8: per device" '^budget +501000000000 B .* for the group: 62625000000 B .* per device$' "$out"
expect "tp 8: blocks per device" "each device's pool: 191116 blocks of 327680 B, 3057856 tokens" "$out"
expect "tp 8: 4k sequences" '^4k +4096 +0\.67 GB +256 +746$' "$out"
# TP=2 on 2 GPUs: the same blocks and sequences as one kvshared of the
# whole model on the same memory (26321 blocks, 102 at 4k).
# shellcheck disable=SC2086
out=$("$KVSHARE" calc $node --tp 2) || fail=1
expect "tp 2: blocks" "each device's pool: 26321 blocks of 1310720 B, 421136 tokens" "$out"
expect "tp 2: 4k" '^4k +4096 +0\.67 GB +256 +102$' "$out"
# Fewer KV heads than ranks: one head per rank, each held twice; MLA: the
# whole latent on every rank.
out=$("$KVSHARE" calc --model llama-3.1-8b --tp 16 --budget 100GB --json) || fail=1
expect "tp 16 json" '"tp":16,"rank_kv_heads":1,"replication":2,"rank_bytes_per_token":16384,"rank_block_bytes":262144,"device_budget_bytes":6250000000,' "$out"
out=$("$KVSHARE" calc --model deepseek-v3 --tp 8 --budget 80GB) || fail=1
expect "tp 8 mla" '^per rank +tp 8: the whole latent on every rank' "$out"

# usage errors: exit 2 and a message
for args in "--model nope" "--layers 8" "--model llama-3.1-8b --budget lots" \
    "--model llama-3.1-8b --context 0" "--model llama-3.1-8b --dtype int4" "--bogus" \
    "--model llama-3.1-8b extra" "--model llama-3.1-8b --gpu-memory 80GB" \
    "--model llama-3.1-8b --weights 16GB" "--model llama-3.1-8b --gpu-memory 0x80GB --weights 1" \
    "--model llama-3.1-8b --gpu-memory 2xGB --weights 1" "--model llama-3.1-8b --gpu-memory lots --weights 1" \
    "--model llama-3.1-8b --gpu-memory 80GB --weights 80GB" \
    "--model llama-3.1-8b --gpu-memory 80GB --weights 60GB --overhead 12GB" \
    "--model llama-3.1-8b --gpu-memory 80GB --weights 16GB --utilization 0" \
    "--model llama-3.1-8b --gpu-memory 80GB --weights 16GB --utilization 1.5" \
    "--model llama-3.1-8b --price-per-hour 6" "--model llama-3.1-8b --budget 1GB --price-per-hour -3" \
    "--model llama-3.1-8b --budget 1GB --price-per-hour 1e3" "--model llama-3.1-8b --users 0" \
    "--model deepseek-v3 --kv-heads 8" "--model llama-3.1-8b --rope-head-dim 64" \
    "--layers 8 --rope-head-dim 64" "--model llama-3.1-70b --tp 3" \
    "--model llama-3.1-70b --tp 0" "--model llama-3.1-70b --tp 65" \
    "--model llama-3.1-70b --gpu-memory 2x80GB --weights 70GB --tp 4"; do
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
