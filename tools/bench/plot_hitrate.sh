#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Hit rate against cache capacity on a request trace, as a table and a PNG
# plot for docs/EVICTION.md:
#   tools/bench/plot_hitrate.sh BENCH TRACE [OUT_PREFIX]
# BENCH is a built kvshare-bench, TRACE the JSONL trace (the Mooncake
# conversation trace for the figures in docs/), OUT_PREFIX defaults to
# docs/hitrate: writes OUT_PREFIX.dat (the table) and OUT_PREFIX.png (needs
# gnuplot; Debian: gnuplot-nox). Capacities are in the trace's 512-token
# blocks; the simulator uses 16-token blocks (lru, freq; freq25: freq's
# earlier rule, a bonus of 25 % of the eviction age with no horizon) and,
# for the comparison with 512-token simulators, 512-token blocks (lru512);
# opt512 is the offline optimum over 512-token ids.
# Two tiers (kvshared --host-tier): tier 1 = T1 units (5 % of the trace's
# distinct ids) plus tier 2 = each of T2S, LRU in both, against one tier of
# LRU at the same total; written to OUT_PREFIX-tiers.dat and plotted at the
# total capacity.
set -eu
BENCH=${1:?usage: plot_hitrate.sh BENCH TRACE [OUT_PREFIX]}
TRACE=${2:?usage: plot_hitrate.sh BENCH TRACE [OUT_PREFIX]}
OUT=${3:-docs/hitrate}
CAPS=${CAPS:-1142,2285,4570,6854,9139,13709,18279,27418,36558,54837,73116,109674}
T1=${T1:-9139}
T2S=${T2S:-0,18279,36558,73116}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BENCH" trace-sim --trace "$TRACE" --cap-units "$CAPS" --policy all --optimum --json >"$tmp/b16.json"
"$BENCH" trace-sim --trace "$TRACE" --cap-units "$CAPS" --policy lru --block-tokens 512 --json \
    >"$tmp/b512.json"
"$BENCH" trace-sim --trace "$TRACE" --cap-units "$CAPS" --policy freq --bonus-pct 25 --horizon-pct off \
    --json >"$tmp/f25.json"
"$BENCH" trace-sim --trace "$TRACE" --cap-units "$T1" --tier2-units "$T2S" --policy lru --json \
    >"$tmp/tiers.json"
totals=$(for t2 in $(echo "$T2S" | tr ',' ' '); do echo $((T1 + t2)); done | paste -sd, -)
"$BENCH" trace-sim --trace "$TRACE" --cap-units "$totals" --policy lru --json >"$tmp/totals.json"

# One row per run: units policy hit_rate (percent).
rows() {
    tr '{' '\n' <"$1" | grep '"policy"' |
        sed -e 's/.*"capacity_units": \([0-9.]*\).*"policy": "\([a-z0-9]*\)", "hit_rate": \([0-9.]*\).*/\1 \2 \3/' |
        awk -v suffix="$2" '{ printf "%s %s%s %.2f\n", $1, $2, suffix, $3 * 100 }'
}
unlimited=$(sed -e 's/.*"unlimited_hit_rate": \([0-9.]*\).*/\1/' "$tmp/b16.json" | awk '{ printf "%.2f", $1 * 100 }')
distinct=$(sed -e 's/.*"distinct_ids": \([0-9]*\).*/\1/' "$tmp/b16.json")
{ rows "$tmp/b16.json" ""; rows "$tmp/b512.json" "512"; rows "$tmp/f25.json" "25"; } >"$tmp/rows"

{
    echo "# hit rate (%) against capacity; trace $(basename "$TRACE"), $distinct distinct 512-token ids"
    echo "# unlimited capacity (16-token blocks): $unlimited %"
    echo "# units_512  pct_distinct  lru  freq  lru512  opt512  freq25"
    for u in $(echo "$CAPS" | tr ',' ' '); do
        awk -v u="$u" -v d="$distinct" '
            $1 + 0 == u + 0 { v[$2] = $3 }
            END { printf "%d %.2f %s %s %s %s %s\n", u, 100 * u / d, v["lru"], v["freq"], v["lru512"], v["opt512"], v["freq25"] }' \
            "$tmp/rows"
    done
} >"$OUT.dat"
cat "$OUT.dat"

# One row per two-tier run: tier-2 units, hit rate, of it in tier 2 (percent).
tr '{' '\n' <"$tmp/tiers.json" | grep '"tier2_units"' |
    sed -e 's/.*"hit_rate": \([0-9.]*\).*"tier2_units": \([0-9.]*\).*"t2_hit_rate": \([0-9.]*\).*/\2 \1 \3/' |
    awk '{ printf "%d %.2f %.2f\n", $1, $2 * 100, $3 * 100 }' >"$tmp/tier_rows"
rows "$tmp/totals.json" "" >"$tmp/total_rows"
{
    echo "# two tiers (LRU in both, exclusive) against one tier of LRU at the same total; trace $(basename "$TRACE")"
    echo "# hit rates in %; capacities in 512-token blocks (the index gets 32 x as many 16-token blocks)"
    echo "# total_units  pct_distinct  tier1_units  tier2_units  two_tiers  of_it_tier2  one_tier_lru"
    while read -r t2 hit t2hit; do
        awk -v t1="$T1" -v t2="$t2" -v hit="$hit" -v t2hit="$t2hit" -v d="$distinct" '
            $1 + 0 == t1 + t2 { one = $3 }
            END { printf "%d %.2f %d %d %s %s %s\n", t1 + t2, 100 * (t1 + t2) / d, t1, t2, hit, t2hit, one }' \
            "$tmp/total_rows"
    done <"$tmp/tier_rows"
} >"$OUT-tiers.dat"
cat "$OUT-tiers.dat"

command -v gnuplot >/dev/null || { echo "gnuplot not found: table only" >&2; exit 0; }
gnuplot <<GP
set terminal pngcairo size 900,560 font ",11"
set output "$OUT.png"
set title "Token hit rate against cache capacity (Mooncake conversation trace, 12,031 requests)"
set xlabel "capacity (two tiers: their total), in 512-token blocks (log scale)"
set ylabel "token hit rate (%)"
set logscale x
set xrange [800:160000]
set grid
set key bottom right
set yrange [0:40]
\$ref << EOD
9139 19.9
18279 28.4
36558 35.1
73116 36.7
EOD
plot "$OUT.dat" using 1:6 with linespoints lw 2 title "offline optimum (512-token ids)", \
     "$OUT.dat" using 1:4 with linespoints lw 2 title "kvshare freq (16-token blocks)", \
     "$OUT.dat" using 1:7 with linespoints dt 4 title "kvshare freq without horizon, 25 % (16-token blocks)", \
     "$OUT.dat" using 1:3 with linespoints lw 2 title "kvshare LRU (16-token blocks)", \
     "$OUT.dat" using 1:5 with linespoints dt 2 title "kvshare LRU (512-token blocks)", \
     "$OUT-tiers.dat" using 1:5 with linespoints lw 2 pt 5 ps 1.3 title "kvshare LRU, tier 1 = 5 % + tier 2 = 0, 10, 20, 40 %", \
     "$OUT-tiers.dat" using 1:7 with points pt 6 ps 2.2 lc rgb "black" title "kvshare LRU, one tier of the same total", \
     \$ref using 1:2 with points pt 7 ps 1.5 lc rgb "black" title "independent LRU simulator (trace README)", \
     $unlimited with lines dt 3 lc rgb "black" title "unlimited capacity ($unlimited %)"
GP
echo "wrote $OUT.dat $OUT-tiers.dat $OUT.png"
