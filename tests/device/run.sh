#!/usr/bin/env bash
# Builds kvshare in its own build directory and runs every GPU test in one go:
#   - the Check suite of the cuda backend (tests/gpu/test_backend_cuda.c): pool
#     creation and sizing errors, device copies, export in one process and
#     import in another (a block of a layer written on one side, read on the
#     other, both ways), an import that outlives the exporter;
#   - bench_copy: device-to-device block copy against one cuMemcpy of the same
#     bytes, for Llama-3.1-8B and -70B geometries, each copy checked;
#   - the pure pool suites (geometry, free stack, host backend, calc), cheap.
# Meant for a machine with one GPU, its driver, and the CUDA Toolkit at
# /usr/local/cuda; takes well under 5 minutes on 16 cores.
#
# Exit status: 0 all passed; 77 nothing failed but the GPU tests were skipped
# (no device answered: the reason is printed); 1 something failed.
#
# Environment: BUILD_DIR (default build-device), JOBS (default nproc),
# CUDA_ROOT (default /usr/local/cuda); KVS_FAKE_DRIVER=1 rehearses the whole
# script without a GPU against the test driver (tests/gpu/fake_cuda.c).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

BUILD_DIR=${BUILD_DIR:-build-device}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$PWD/$BUILD_DIR ;; esac
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
TARGETS="kvs_gpu test_geometry test_pool test_calc test_backend_host test_backend_cuda bench_copy kvshare"
if [ "${KVS_FAKE_DRIVER:-0}" = 1 ]; then
    TARGETS="$TARGETS fake_cuda"
    export KVS_FAKE_CUDA=ok KVS_FAKE_CUDA_FREE_MIB=8192
    export LD_LIBRARY_PATH="$BUILD_DIR/tests/gpu/fake_cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "KVS_FAKE_DRIVER=1: using the test driver, not a GPU; figures mean nothing"
fi
start=$(date +%s)

step() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }

step "machine"
uname -sr
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
    --format=csv,noheader 2>&1 | head -4 || echo "nvidia-smi not found"
[ -f "$CUDA_ROOT/include/cuda.h" ] && grep -m1 '#define CUDA_VERSION' "$CUDA_ROOT/include/cuda.h" ||
    echo "no cuda.h under $CUDA_ROOT/include: the cuda backend will not be built"

# Without the project's other dependencies (libuv, protobuf-c, ...), cmake
# cannot configure; the GPU tests need only the pool library, Check and the
# CUDA headers, so build those directly instead.
direct_build() {
    local out="$BUILD_DIR/tests/gpu" kv="$BUILD_DIR/tools/kvshare"
    local cflags=(-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Igpu -Iclient)
    local lib=(gpu/geometry.c gpu/pool.c gpu/backend.c gpu/backend_host.c)
    if [ -f "$CUDA_ROOT/include/cuda.h" ]; then
        cflags+=(-I"$CUDA_ROOT/include" -DKVS_HAVE_CUDA=1)
        lib+=(gpu/backend_cuda.c)
    else
        lib+=(gpu/backend_cuda_none.c)
    fi
    mkdir -p "$out" "$kv" || return 1
    cc "${cflags[@]}" "${lib[@]}" tests/device/bench_copy.c -o "$out/bench_copy" -ldl -lpthread &&
        cc "${cflags[@]}" "${lib[@]}" tools/kvshare/main.c tools/kvshare/calc.c -Itools/kvshare \
            -o "$kv/kvshare" -ldl -lpthread || return 1
    if ! pkg-config --exists check 2>/dev/null; then
        echo "Check (libcheck) not found: only bench_copy and kvshare are built"
        return 0
    fi
    local t
    for t in test_backend_cuda test_geometry test_pool test_calc test_backend_host; do
        # shellcheck disable=SC2046
        cc "${cflags[@]}" "${lib[@]}" "tests/gpu/$t.c" -o "$out/$t" \
            $(pkg-config --cflags --libs check) -lm -ldl -lpthread || return 1
    done
}

step "configure ($BUILD_DIR)"
mkdir -p "$BUILD_DIR"
# Warnings are CI's business; here a new compiler's warning must not stop the run.
if cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVS_WERROR=OFF \
    -DCUDAToolkit_ROOT="$CUDA_ROOT" >"$BUILD_DIR/configure.log" 2>&1; then
    grep -E 'cuda backend' "$BUILD_DIR/configure.log"
    step "build"
    # shellcheck disable=SC2086
    if ! cmake --build "$BUILD_DIR" -j "$JOBS" --target $TARGETS; then
        echo "FAILED: build"
        exit 1
    fi
else
    tail -5 "$BUILD_DIR/configure.log"
    echo "cmake could not configure the whole project (missing dependencies?): building the"
    echo "pool library and its tests directly with cc"
    step "direct build"
    if ! direct_build; then
        echo "FAILED: build"
        exit 1
    fi
fi

failed=0
skipped=0
# run NAME SECONDS CMD...: runs one program, notes pass/skip/fail.
run() {
    local name=$1 limit=$2
    shift 2
    step "$name"
    if [ ! -x "$1" ] && [ "$1" != sh ]; then
        echo "-- $name: NOT BUILT"
        failed=1
        return
    fi
    CK_FORK=yes timeout "$limit" "$@"
    local rc=$?
    case $rc in
    0) echo "-- $name: passed" ;;
    77) echo "-- $name: skipped"; skipped=1 ;;
    124) echo "-- $name: FAILED (timed out after ${limit}s)"; failed=1 ;;
    *) echo "-- $name: FAILED (exit $rc)"; failed=1 ;;
    esac
}

T="$BUILD_DIR/tests/gpu"
run "cuda backend suite" 180 "$T/test_backend_cuda"
run "block copy bandwidth" 120 "$T/bench_copy"
run "geometry" 30 "$T/test_geometry"
run "free stack" 30 "$T/test_pool"
run "capacity planner arithmetic" 30 "$T/test_calc"
run "host backend" 60 "$T/test_backend_host"
run "kvshare calc" 30 sh tests/gpu/calc_cli.sh "$BUILD_DIR/tools/kvshare/kvshare"

step "done"
if [ $failed -ne 0 ]; then
    echo "RESULT: FAILED"
    exit 1
fi
if [ $skipped -ne 0 ]; then
    echo "RESULT: passed, GPU tests SKIPPED (no CUDA device answered)"
    exit 77
fi
echo "RESULT: all passed"
exit 0
