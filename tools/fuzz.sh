#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (tests/fuzz/) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in their own build directory, then runs each for
# a bounded time, starting from the committed seeds. Fails on any crash,
# leak, sanitizer report, timeout or broken invariant (the targets abort).
#
#   tools/fuzz.sh                 every target, FUZZ_SECONDS (default 50) each
#   FUZZ_SECONDS=600 tools/fuzz.sh fuzz_radix fuzz_client
#
# Environment: FUZZ_SECONDS, FUZZ_BUILD (default build-fuzz), CC (default
# clang). New inputs found go to $FUZZ_BUILD/corpus/<target>/ (never into the
# tree); a crashing input is saved as $FUZZ_BUILD/artifacts/<target>/crash-*
# and replays with: $FUZZ_BUILD/tests/fuzz/<target> <file>
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-50}
build=${FUZZ_BUILD:-build-fuzz}
cc=${CC:-clang}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_session fuzz_lookup_codec fuzz_radix fuzz_client)

if ! command -v "$cc" >/dev/null; then
    echo "fuzz.sh: $cc not found (tools/install-deps.sh installs clang)" >&2
    exit 1
fi

# fuzzer-no-link instruments every library the targets link (the daemon,
# the index, the pool), so coverage guides the fuzzer through their code;
# the targets themselves link libFuzzer (tests/fuzz/CMakeLists.txt).
cmake -S . -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug -DKVS_FUZZ=ON \
    -DKVS_SANITIZE=ON -DKVS_WITH_CUDA=OFF -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link -O1" \
    >/dev/null
cmake --build "$build" -j2 --target "${targets[@]}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for t in "${targets[@]}"; do
    seeds=tests/fuzz/corpus_${t#fuzz_}
    work=$build/corpus/$t
    artifacts=$build/artifacts/$t
    mkdir -p "$work" "$artifacts"
    log=$build/$t.log
    echo "== $t: ${seconds}s from $(find "$seeds" -type f | wc -l) seeds"
    # New inputs go into $work (the first directory); the seeds are read only.
    if "$build/tests/fuzz/$t" "$work" "$seeds" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
        -artifact_prefix="$artifacts/" >"$log" 2>&1; then
        runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -1)
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "   ok: ${runs:-?} executions, ${cov:-cov: ?}, corpus $(find "$work" -type f | wc -l) inputs"
    else
        status=1
        echo "   FAILED: last lines of $log:"
        tail -40 "$log"
        ls "$artifacts"
    fi
done
exit $status
