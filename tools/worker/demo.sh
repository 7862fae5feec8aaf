#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kvshare demo: decode workers sharing a chat workload's system prompts
# through kvshared, compared with the same workers computing alone.
#
#   tools/worker/demo.sh [--build DIR] [--model default|small] [--workers N]
#                        [--requests N] [--systems N] [--system-tokens N]
#                        [--question-tokens N] [--decode N]
#
# Starts kvshared (host backend, the model's KV geometry, a temporary socket;
# it signals readiness on --ready-fd), runs the workers one after another
# privately, then one after another through the daemon, then all at once
# on the warm cache, and checks that every run generated the same tokens and
# final logits. Prints hit rate, prefill tokens saved and time to first
# token with and without sharing; stops the daemon with SIGTERM.
# Then tier 2 (kvshared --host-tier): one worker runs a prompt, another
# prompt that needs the whole pool, and the first prompt again, against a
# daemon whose pool holds one request, without and then with a tier 2; it
# prints the repeated prompt's time to first token (evicted: full prefill;
# demoted: promoted back) and checks that its outputs did not change.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${KVS_BUILD_DIR:-$here/../../build}
model=default
workers=3
requests=2
systems=2
system_tokens=768
question_tokens=48
decode=16

while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --systems) systems=$2; shift 2 ;;
    --system-tokens) system_tokens=$2; shift 2 ;;
    --question-tokens) question_tokens=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown option $1" >&2; exit 2 ;;
    esac
done

kvshared=$build/daemon/kvshared
worker=$build/tools/worker/kvshare-worker
cli=$build/tools/kvshare/kvshare
for b in "$kvshared" "$worker"; do
    [ -x "$b" ] || { echo "demo.sh: $b not built (cmake --build $build)" >&2; exit 2; }
done

case $model in
default) geometry=(--layers 4 --kv-heads 2 --head-dim 64) vocab=4096 block_bytes=65536 ;;
small) geometry=(--layers 2 --kv-heads 2 --head-dim 16) vocab=256 block_bytes=8192 ;;
*) echo "demo.sh: unknown model $model (default, small)" >&2; exit 2 ;;
esac

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvshare-demo.XXXXXX")
daemon_pid=
cleanup() {
    if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
    rm -rf "$dir"
}
trap cleanup EXIT

# kvshared on a temporary socket, POOL_BLOCKS blocks and any further flags;
# returns once it has written READY.
start_daemon() {
    local fifo=$dir/ready pool_blocks=$1
    shift
    rm -f "$dir/kvshared.sock" "$fifo"
    mkfifo "$fifo"
    "$kvshared" --socket "$dir/kvshared.sock" --backend host "${geometry[@]}" --dtype fp32 \
        --block-tokens 16 --pool-blocks "$pool_blocks" "$@" --ready-fd 3 --log-level warn 3>"$fifo" &
    daemon_pid=$!
    local line
    if ! read -r -t 20 line <"$fifo" || [ "$line" != READY ]; then
        echo "demo.sh: kvshared did not start" >&2
        exit 1
    fi
}

stop_daemon() {
    kill -TERM "$daemon_pid"
    local rc=0
    wait "$daemon_pid" || rc=$?
    daemon_pid=
    [ "$rc" -eq 0 ] || { echo "demo.sh: kvshared exited with $rc" >&2; exit 1; }
}

# run_worker MODE INDEX: worker INDEX takes requests [INDEX * requests, ...).
run_worker() {
    local mode=$1 i=$2 tag=$3
    local args=("--$mode" --model "$model" --systems "$systems" --system-tokens "$system_tokens"
        --question-tokens "$question_tokens" --decode "$decode" --requests "$requests"
        --first $((i * requests)) --json --logits-out "$dir/$tag.$i.bin")
    [ "$mode" = kvs ] && args+=(--socket "$dir/kvshared.sock" --namespace demo)
    "$worker" "${args[@]}" >"$dir/$tag.$i.json"
}

# Value of a numeric field of a JSON line.
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }

# report TAG: per-worker and total figures of a run.
report() {
    local tag=$1 title=$2 prompt=0 matched=0 prefill=0 i
    echo "$title"
    for i in $(seq 0 $((workers - 1))); do
        local s first_ttft mean_ttft
        s=$(grep '"summary"' "$dir/$tag.$i.json")
        first_ttft=$(grep '"request"' "$dir/$tag.$i.json" | head -1 | field ttft_ms)
        mean_ttft=$(echo "$s" | field mean_ttft_ms)
        prompt=$((prompt + $(echo "$s" | field prompt_tokens)))
        matched=$((matched + $(echo "$s" | field matched_tokens)))
        prefill=$((prefill + $(echo "$s" | field prefill_tokens)))
        printf '  worker %d: ttft first request %9.1f ms, mean %9.1f ms, prefill %5d tokens, matched %5d\n' \
            "$i" "$first_ttft" "$mean_ttft" "$(echo "$s" | field prefill_tokens)" \
            "$(echo "$s" | field matched_tokens)"
    done
    eval "${tag}_prompt=$prompt ${tag}_matched=$matched ${tag}_prefill=$prefill"
}

# The tokens, logits hashes and logits bytes of a run equal the private run's.
check_same() {
    local tag=$1 i
    for i in $(seq 0 $((workers - 1))); do
        cmp -s "$dir/private.$i.bin" "$dir/$tag.$i.bin" ||
            { echo "demo.sh: worker $i ($tag): final logits differ from the private run" >&2; exit 1; }
        diff <(grep -o '"logits_hash".*' "$dir/private.$i.json") \
            <(grep -o '"logits_hash".*' "$dir/$tag.$i.json") >/dev/null ||
            { echo "demo.sh: worker $i ($tag): generated tokens differ from the private run" >&2; exit 1; }
    done
}

mean_ttft() { cat "$dir"/"$1".*.json | grep '"request"' | field ttft_ms | awk '{s += $1; n++} END {printf "%.1f", s / n}'; }

echo "kvshare demo: $workers workers x $requests requests, model $model, $systems system prompts of" \
    "$system_tokens tokens, questions of ~$question_tokens tokens, $decode generated tokens each"
echo

for i in $(seq 0 $((workers - 1))); do run_worker private "$i" private; done
report private "1. private KV (no daemon), workers one after another:"
echo

start_daemon 4096
for i in $(seq 0 $((workers - 1))); do run_worker kvs "$i" shared; done
report shared "2. shared through kvshared, workers one after another:"
check_same shared
echo

pids=()
for i in $(seq 0 $((workers - 1))); do run_worker kvs "$i" concurrent & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
report concurrent "3. the same conversations again, all workers at once on the warm cache:"
check_same concurrent
if [ -x "$cli" ]; then
    echo "  kvshared's view:"
    "$cli" stats --socket "$dir/kvshared.sock" | sed 's/^/    /'
fi
stop_daemon
echo

hit=$(awk -v m="$shared_matched" -v p="$shared_prompt" 'BEGIN {printf "%.1f", 100 * m / p}')
echo "summary (run 2 vs run 1):"
echo "  every generated token and final logits equal the private run's (runs 2 and 3)"
echo "  hit rate: $shared_matched of $shared_prompt prompt tokens from the cache ($hit%)"
echo "  prefill tokens computed: $private_prefill private, $shared_prefill shared" \
    "($((private_prefill - shared_prefill)) saved)"
echo "  mean time to first token: $(mean_ttft private) ms private, $(mean_ttft shared) ms shared"
echo "  kvshared stopped cleanly (SIGTERM, exit 0)"
echo

# Tier 2. Prompts A and B of system + question tokens each, then A again.
# The pool holds exactly one request (its full blocks cached, the decode
# block free), so B's Alloc takes every block of A: dropped without a tier
# 2, demoted with one (room for two prompts), and A's second lookup then
# promotes them.
len=$((system_tokens + question_tokens))
pool=$(((len + decode - 1 + 15) / 16))
hit=$(((len - 1) / 16 * 16))
awk -v n="$len" -v v="$vocab" 'BEGIN {
    for (p = 0; p < 3; p++) {
        m = p == 1 ? 11 : 7
        for (i = 0; i < n; i++) printf "%d%s", (i * m + 3) % v, i + 1 < n ? " " : "\n"
    }
}' >"$dir/tier.prompts"

# run_tier TAG [kvshared flags...]: A, B, A through a fresh daemon.
run_tier() {
    local tag=$1
    shift
    start_daemon "$pool" "$@"
    "$worker" --kvs --socket "$dir/kvshared.sock" --namespace tier --model "$model" \
        --prompts "$dir/tier.prompts" --decode "$decode" --json \
        --logits-out "$dir/$tag.bin" >"$dir/$tag.json"
    if [ -x "$cli" ]; then "$cli" stats --json --socket "$dir/kvshared.sock" >"$dir/$tag.stats"; fi
    stop_daemon
    grep -q '"fallbacks":0' "$dir/$tag.json" ||
        { echo "demo.sh: tier run $tag: a request ran privately" >&2; exit 1; }
}

run_tier tier_off
run_tier tier_on --host-tier $((2 * pool * block_bytes))
# The repeated prompt's final logits equal its first run's, in both runs.
per=$((vocab * 4))
for tag in tier_off tier_on; do
    cmp -s <(head -c "$per" "$dir/$tag.bin") <(tail -c +$((2 * per + 1)) "$dir/$tag.bin") ||
        { echo "demo.sh: $tag: the repeated prompt's final logits differ from its first run's" >&2; exit 1; }
done
cmp -s "$dir/tier_off.bin" "$dir/tier_on.bin" ||
    { echo "demo.sh: final logits differ between tier 2 off and on" >&2; exit 1; }
nth() { grep '"request"' "$dir/$1.json" | sed -n "$2p"; }
off_matched=$(nth tier_off 3 | field matched_tokens)
on_matched=$(nth tier_on 3 | field matched_tokens)
[ "$off_matched" -eq 0 ] ||
    { echo "demo.sh: tier 2 off: the repeated prompt matched $off_matched tokens, not 0" >&2; exit 1; }
[ "$on_matched" -eq "$hit" ] ||
    { echo "demo.sh: tier 2 on: the repeated prompt matched $on_matched tokens, not $hit" >&2; exit 1; }
promoted=
if [ -f "$dir/tier_on.stats" ]; then
    promoted=$(field tier_promotions <"$dir/tier_on.stats")
    [ "${promoted:-0}" -ge $((hit / 16)) ] ||
        { echo "demo.sh: tier 2 on: kvshared promoted ${promoted:-no} blocks" >&2; exit 1; }
    promoted=", kvshared promoted $promoted blocks"
fi
echo "4. tier 2: prompt A ($len tokens), prompt B (takes the whole pool of $pool blocks), A again:"
printf '  tier 2 off: ttft of A %9.1f ms, of A again %9.1f ms (matched %4d tokens: evicted, full prefill)\n' \
    "$(nth tier_off 1 | field ttft_ms)" "$(nth tier_off 3 | field ttft_ms)" "$off_matched"
printf '  tier 2 on:  ttft of A %9.1f ms, of A again %9.1f ms (matched %4d tokens: promoted from tier 2)\n' \
    "$(nth tier_on 1 | field ttft_ms)" "$(nth tier_on 3 | field ttft_ms)" "$on_matched"
echo "  A's tokens and final logits: the same every time, tier 2 off and on$promoted"
