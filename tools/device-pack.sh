#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs what tests/device/run.sh needs into one folder, so that a GPU machine
# with the NVIDIA driver but none of the project's build dependencies (libuv,
# protobuf-c, xxHash, Check) can run the device checks without configuring or
# compiling anything:
#
#   tools/device-pack.sh            # builds build-device/, fills .device/
#   tests/device/run.sh             # there (or here with KVS_FAKE_DRIVER=1)
#
# .device/ (ignored by git) holds bin/ (the daemon, the CLI, the test and
# bench programs), lib/ (libkvshare and every shared library they load that
# is not part of glibc, copied from this machine), fake/ (the stand-in
# libcuda.so.1 for rehearsals without a GPU) and MANIFEST (commit, date,
# sizes). glibc itself is not packed: the target's own, same or newer, serves.
#
# Environment: BUILD_DIR (default build-device), PACK_DIR (default .device),
# JOBS (default 2), CUDA_ROOT (default /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-device}
PACK_DIR=${PACK_DIR:-.device}
JOBS=${JOBS:-2}
CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
LIMIT_MIB=64 # what the device tool carries

# Programs, by build-tree path. The tests link the code that runs; nothing
# here is built differently for the device.
PROGRAMS=(
    daemon/kvshared
    tools/kvshare/kvshare
    tests/gpu/test_backend_cuda
    tests/gpu/test_geometry
    tests/gpu/test_pool
    tests/gpu/test_calc
    tests/gpu/test_backend_host
    tests/gpu/bench_copy
    tests/integration/test_cuda_share
    tests/integration/test_tier
    tests/integration/test_tier_disk3
    tools/bench/kvshare-bench
)
TARGETS="kvshared kvshare kvshare_shared test_backend_cuda test_geometry test_pool test_calc
test_backend_host bench_copy test_cuda_share test_tier test_tier_disk3 kvshare-bench fake_cuda"

if [ ! -f "$CUDA_ROOT/include/cuda.h" ]; then
    echo "device-pack: no cuda.h under $CUDA_ROOT/include: the cuda backend cannot be built" >&2
    exit 1
fi

echo "device-pack: configuring and building $BUILD_DIR"
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDAToolkit_ROOT="$CUDA_ROOT" \
    -DKVS_NVCC="$CUDA_ROOT/bin/nvcc" \
    >"$BUILD_DIR/configure.log" 2>&1 || {
    cat "$BUILD_DIR/configure.log" >&2
    exit 1
}
if ! grep -q "cuda backend ON" "$BUILD_DIR/configure.log"; then
    echo "device-pack: the cuda backend is not built (see $BUILD_DIR/configure.log)" >&2
    exit 1
fi
# The device run measures the gather kernel against the copy engine: a pack
# without it would measure the engine only.
if ! grep -q "block copy kernel ON" "$BUILD_DIR/configure.log"; then
    echo "device-pack: the block copy kernel is not built (no nvcc under $CUDA_ROOT/bin?" \
        "see $BUILD_DIR/configure.log)" >&2
    exit 1
fi
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$JOBS" --target $TARGETS >/dev/null

rm -rf "$PACK_DIR"
mkdir -p "$PACK_DIR/bin" "$PACK_DIR/lib" "$PACK_DIR/fake"
for p in "${PROGRAMS[@]}"; do
    cp "$BUILD_DIR/$p" "$PACK_DIR/bin/"
done
# libkvshare.so, the soname it links to and the file (not stale versions).
lib=$BUILD_DIR/client/libkvshare.so
while [ -n "$lib" ]; do
    cp -P "$lib" "$PACK_DIR/lib/"
    next=$(readlink "$lib" || true)
    lib=${next:+$BUILD_DIR/client/$next}
done
cp "$BUILD_DIR/tests/gpu/fake_cuda/libcuda.so.1" "$PACK_DIR/fake/"

# Every shared library the programs load, except glibc's own and the driver.
is_glibc() {
    case $1 in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | \
        libresolv.so.* | libutil.so.*) return 0 ;;
    esac
    return 1
}
for f in "$PACK_DIR"/bin/* "$PACK_DIR"/lib/libkvshare.so; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    is_glibc "$name" && continue
    case $name in libkvshare.so* | libcuda.so*) continue ;; esac
    cp -L "$path" "$PACK_DIR/lib/$name"
done

# Nothing may be left unresolved with the packed lib/ on the path.
missing=$(for f in "$PACK_DIR"/bin/*; do
    LD_LIBRARY_PATH="$PACK_DIR/lib" ldd "$f" | grep 'not found' || true
done)
if [ -n "$missing" ]; then
    echo "device-pack: unresolved libraries:" >&2
    echo "$missing" >&2
    exit 1
fi

{
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . || echo ' (with uncommitted changes)')"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
    echo "cuda headers $(grep -m1 '#define CUDA_VERSION' "$CUDA_ROOT/include/cuda.h" | awk '{print $3}')"
    echo "copy kernel $(wc -c <"$BUILD_DIR/gpu/gather.fatbin") B fatbin: sm_80 sm_90 sm_100 + compute_100 PTX, $("$CUDA_ROOT/bin/nvcc" --version | tail -1)"
    (cd "$PACK_DIR" && find . -type f -printf '%s %p\n' | sort -k2)
} >"$PACK_DIR/MANIFEST"

size_kib=$(du -sk "$PACK_DIR" | cut -f1)
echo "device-pack: $PACK_DIR: $(find "$PACK_DIR" -type f | wc -l) files, $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "device-pack: larger than the $LIMIT_MIB MiB that can be carried" >&2
    exit 1
fi
