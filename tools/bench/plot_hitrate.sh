#!/bin/sh
# Hit rate against cache capacity on a request trace, as a table and a PNG
# plot for docs/EVICTION.md:
#   tools/bench/plot_hitrate.sh BENCH TRACE [OUT_PREFIX]
# BENCH is a built kvshare-bench, TRACE the JSONL trace (the Mooncake
# conversation trace for the figures in docs/), OUT_PREFIX defaults to
# docs/hitrate: writes OUT_PREFIX.dat (the table) and OUT_PREFIX.png (needs
# gnuplot; Debian: gnuplot-nox). Capacities are in the trace's 512-token
# blocks; the simulator uses 16-token blocks (lru, freq) and, for the
# comparison with 512-token simulators, 512-token blocks (lru512); opt512 is
# the offline optimum over 512-token ids.
set -eu
BENCH=${1:?usage: plot_hitrate.sh BENCH TRACE [OUT_PREFIX]}
TRACE=${2:?usage: plot_hitrate.sh BENCH TRACE [OUT_PREFIX]}
OUT=${3:-docs/hitrate}
CAPS=${CAPS:-1142,2285,4570,6854,9139,13709,18279,27418,36558,54837,73116,109674}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$BENCH" trace-sim --trace "$TRACE" --cap-units "$CAPS" --policy all --optimum --json >"$tmp/b16.json"
"$BENCH" trace-sim --trace "$TRACE" --cap-units "$CAPS" --policy lru --block-tokens 512 --json \
    >"$tmp/b512.json"

# One row per run: units policy hit_rate (percent).
rows() {
    tr '{' '\n' <"$1" | grep '"policy"' |
        sed -e 's/.*"capacity_units": \([0-9.]*\).*"policy": "\([a-z0-9]*\)", "hit_rate": \([0-9.]*\).*/\1 \2 \3/' |
        awk -v suffix="$2" '{ printf "%s %s%s %.2f\n", $1, $2, suffix, $3 * 100 }'
}
unlimited=$(sed -e 's/.*"unlimited_hit_rate": \([0-9.]*\).*/\1/' "$tmp/b16.json" | awk '{ printf "%.2f", $1 * 100 }')
distinct=$(sed -e 's/.*"distinct_ids": \([0-9]*\).*/\1/' "$tmp/b16.json")
{ rows "$tmp/b16.json" ""; rows "$tmp/b512.json" "512"; } >"$tmp/rows"

{
    echo "# hit rate (%) against capacity; trace $(basename "$TRACE"), $distinct distinct 512-token ids"
    echo "# unlimited capacity (16-token blocks): $unlimited %"
    echo "# units_512  pct_distinct  lru  freq  lru512  opt512"
    for u in $(echo "$CAPS" | tr ',' ' '); do
        awk -v u="$u" -v d="$distinct" '
            $1 + 0 == u + 0 { v[$2] = $3 }
            END { printf "%d %.2f %s %s %s %s\n", u, 100 * u / d, v["lru"], v["freq"], v["lru512"], v["opt512"] }' \
            "$tmp/rows"
    done
} >"$OUT.dat"
cat "$OUT.dat"

command -v gnuplot >/dev/null || { echo "gnuplot not found: table only" >&2; exit 0; }
gnuplot <<GP
set terminal pngcairo size 900,560 font ",11"
set output "$OUT.png"
set title "Token hit rate against cache capacity (Mooncake conversation trace, 12,031 requests)"
set xlabel "capacity, in 512-token blocks (log scale)"
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
     "$OUT.dat" using 1:3 with linespoints lw 2 title "kvshare LRU (16-token blocks)", \
     "$OUT.dat" using 1:5 with linespoints dt 2 title "kvshare LRU (512-token blocks)", \
     \$ref using 1:2 with points pt 7 ps 1.5 lc rgb "black" title "independent LRU simulator (trace README)", \
     $unlimited with lines dt 3 lc rgb "black" title "unlimited capacity ($unlimited %)"
GP
echo "wrote $OUT.dat $OUT.png"
