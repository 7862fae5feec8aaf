#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Pipelined throughput of several kvshared builds and of Redis, in the same
# run: 64-token Lookups, 4 connections x 64 in flight (kvshare-bench rpc
# --pipelined), and Redis GET with 4 clients x 64 pipelined over a Unix
# socket (redis-benchmark), in alternating rounds so that the machine's
# drift falls on all alike. Prints one line per round and binary, then each
# kvshared's ratio to Redis GET per round and its range over the rounds.
#
#   tools/bench/compare-pipelined.sh BENCH ROUNDS KVSHARED...
#
# BENCH is a kvshare-bench binary; redis-server and redis-benchmark are used
# when they are on PATH. Besides the rate, each kvshared line gives the
# daemon's CPU time per Lookup: what the rate cannot show on a machine
# that other work shares.
set -eu
bench=$1
rounds=$2
shift 2
dir=$(mktemp -d)
redis_pid=
cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM
if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null; then
    redis-server --port 0 --unixsocket "$dir/redis.sock" --save "" --appendonly no \
        --dir "$dir" >"$dir/redis.log" 2>&1 &
    redis_pid=$!
    i=0
    while [ ! -S "$dir/redis.sock" ] && [ $i -lt 100 ]; do
        sleep 0.05
        i=$((i + 1))
    done
    redis-benchmark -s "$dir/redis.sock" -q -t set -n 1000 >/dev/null
fi
r=1
while [ $r -le "$rounds" ]; do
    for k in "$@"; do
        line=$("$bench" rpc --pipelined --seconds 2 --kvshared "$k" |
            awk '/4 connections/ {
                for (i = 1; i <= NF; i++) {
                    if ($i == "flight:") rate = $(i + 1)
                    if ($i == "CPU") cpu = $(i + 1)
                }
                print rate "/s  " cpu " us CPU each"
            }')
        echo "round $r  $line  $k"
        echo "$r ${line%%/s*} $k" >>"$dir/rates"
    done
    if [ -n "$redis_pid" ]; then
        rate=$(redis-benchmark -s "$dir/redis.sock" -c 4 -P 64 -t get -n 4000000 --csv |
            awk -F'"' '/GET/ {print $4}')
        echo "round $r  $rate/s  redis GET, 4 clients x 64 pipelined"
        echo "$r $rate" >>"$dir/redis"
    fi
    r=$((r + 1))
done
# Each kvshared's Lookups per second over Redis GET's of the same round:
# the same clients, depth and machine drift (the target: 1.1x or more).
if [ -s "$dir/redis" ]; then
    awk 'NR == FNR { redis[$1] = $2; next }
         redis[$1] > 0 {
             x = $2 / redis[$1]
             printf "round %s  %.3fx redis GET  %s\n", $1, x, $3
             if (!($3 in lo) || x < lo[$3]) lo[$3] = x
             if (!($3 in hi) || x > hi[$3]) hi[$3] = x
             n[$3]++; sum[$3] += x
         }
         END {
             for (k in n)
                 printf "ratio to redis GET over %d rounds: %.3fx-%.3fx (mean %.3fx)  %s\n",
                        n[k], lo[k], hi[k], sum[k] / n[k], k
         }' "$dir/redis" "$dir/rates"
fi
