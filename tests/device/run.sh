#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The device checks, in one run, from the folder tools/device-pack.sh fills
# (.device/: programs, libkvshare and the libraries they load), so that the GPU
# machine needs no configure step and none of the build dependencies:
#
#   tools/device-pack.sh && tests/device/run.sh          # pack here, run there
#   tools/device-pack.sh && KVS_FAKE_DRIVER=1 tests/device/run.sh
#                                                        # rehearsal (CI), no GPU
#
# What it proves, each step reported as passed or FAILED:
#   - the cuda backend's Check suite: pool creation and sizing errors, copies,
#     export in one process and import in another, an import that outlives
#     the exporter, batched copies timed by events; again with 2 MiB slabs;
#   - kvshared --backend cuda serving two worker processes through the real
#     daemon -> SCM_RIGHTS -> import path (test_cuda_share), with the import
#     time per worker, with a model-sized geometry, with slots across the
#     boundaries of many slabs, and with the device named by UUID in
#     CUDA_VISIBLE_DEVICES; a worker reads the pool after the daemon is
#     killed, and a new daemon starts while workers still map the old pool;
#   - PyTorch on shared blocks: tensors over pool memory, reused bitwise by
#     another process (tests/client/torch_share.py);
#   - block copy against one cuMemcpy of the same bytes, latency and
#     pipelined bandwidth (bench_copy), through the copy engine and through
#     the gather kernel (gpu/gather.cu, loaded from the library's fatbin);
#     the cuda suite also checks both paths bit-exact against each other;
#   - tier 2 on the cuda backend: every test_tier case against kvshared
#     --backend cuda --host-tier (copies between device memory and pinned
#     tier-2 memory on the backend's stream, workers SIGKILLed mid-copy, a
#     full tier 2, tier 2 read in place), then `kvshare-bench tier-copy
#     --backend cuda`: demotions and promotions of 4k-token llama-3.1-8b
#     prefixes against plain cuMemcpy DtoH / HtoD of the same sizes on the
#     same threads, once through the copy engine, once through the gather
#     kernel (KVS_CUDA_COPY=engine / kernel), once with the automatic choice
#     (target: at least 90 % of the plain copies); test_tier again with the
#     kernel forced (tier round trips bit-exact through it);
#   - the disk tier under a GPU pool: every test_tier_disk3 case against
#     kvshared --backend cuda (three-tier round trips bitwise, a SIGKILL in
#     the middle of disk writes and a warm restart, flipped slots never
#     served), with the tier file under $PACK_DIR/tmp (a disk file system:
#     O_DIRECT);
#   - the reference worker through a promoted block: torch_share.py with the
#     prompt's blocks pushed to tier 2, then to the disk, between writer and
#     reader, and read back bitwise through tensors on the GPU;
#   - the pure pool suites and `kvshare calc`.
# A step that reports "skipped" while a GPU is visible is a failure: the GPU
# was there and the check did not run. Everything is logged to LOG (default
# $OUT/device-run.log where OUT is set, else device-run.log in the packed
# folder). Meant to
# finish well within 5 minutes; each step has its own timeout.
#
# At the end, FIGURES repeats every measured line (ratios, GB/s, the copy
# path chosen) for docs/GPU.md.
#
# Exit status: 0 all passed; 77 no GPU visible and the GPU steps skipped (the
# reason is printed); 1 something failed.
#
# Environment: PACK_DIR (default .device), LOG, PYTHON (default python3: the
# one with PyTorch on the GPU machine), KVS_FAKE_DRIVER=1 (use the
# stand-in driver packed in .device/fake, not a GPU; figures mean nothing).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1

PACK_DIR=${PACK_DIR:-.device}
case $PACK_DIR in /*) ;; *) PACK_DIR=$PWD/$PACK_DIR ;; esac
LOG=${LOG:-${OUT:-$PACK_DIR}/device-run.log}
exec > >(tee "$LOG") 2>&1

BIN=$PACK_DIR/bin
start=$(date +%s)
step() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }

if [ ! -f "$PACK_DIR/MANIFEST" ]; then
    echo "no packed folder at $PACK_DIR: run tools/device-pack.sh on the build machine first"
    echo "RESULT: FAILED"
    exit 1
fi
export LD_LIBRARY_PATH="$PACK_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVS_KVSHARED="$BIN/kvshared"
fake=0
if [ "${KVS_FAKE_DRIVER:-0}" = 1 ]; then
    fake=1
    export KVS_FAKE_CUDA=ok KVS_FAKE_CUDA_FREE_MIB=4096
    export LD_LIBRARY_PATH="$PACK_DIR/fake:$LD_LIBRARY_PATH"
    echo "KVS_FAKE_DRIVER=1: the stand-in driver, not a GPU; figures mean nothing"
fi

step "machine"
cat "$PACK_DIR/MANIFEST" | head -3
uname -srm
gpu_visible=0
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,memory.used,compute_mode,persistence_mode,mig.mode.current \
        --format=csv 2>&1 | head -9
    nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && gpu_visible=1
else
    echo "nvidia-smi not found"
fi
ls /dev/nvidia[0-9]* >/dev/null 2>&1 && gpu_visible=1
[ $fake = 1 ] && gpu_visible=1 # the stand-in driver always answers
# The container runtime: gVisor's kernel and the usual container markers.
runtime="none seen"
if dmesg 2>/dev/null | grep -qi gvisor || grep -qi gvisor /proc/version 2>/dev/null; then
    runtime="gVisor"
elif [ -f /.dockerenv ]; then
    runtime="docker"
elif [ -f /run/.containerenv ]; then
    runtime="podman"
elif grep -qE 'kubepods|docker|containerd' /proc/1/cgroup 2>/dev/null; then
    runtime="container ($(grep -oE 'kubepods|docker|containerd' /proc/1/cgroup | head -1))"
fi
echo "container runtime: $runtime"
echo "GPU visible: $([ $gpu_visible = 1 ] && echo yes || echo no)"
uuid=""
if [ $fake = 0 ] && command -v nvidia-smi >/dev/null; then
    uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -1)
fi

failed=0
skipped=0
# run NAME SECONDS CMD...: runs one program, notes passed / skipped / FAILED.
run() {
    local name=$1 limit=$2
    shift 2
    step "$name"
    if ! command -v "$1" >/dev/null; then
        echo "-- $name: FAILED (not packed: $1)"
        failed=1
        return
    fi
    CK_FORK=yes timeout "$limit" "$@"
    local rc=$?
    case $rc in
    0) echo "-- $name: passed" ;;
    77)
        if [ $gpu_visible = 1 ]; then
            echo "-- $name: FAILED (skipped although a GPU is visible)"
            failed=1
        else
            echo "-- $name: skipped (no GPU visible)"
            skipped=1
        fi
        ;;
    124) echo "-- $name: FAILED (timed out after ${limit}s)"; failed=1 ;;
    *) echo "-- $name: FAILED (exit $rc)"; failed=1 ;;
    esac
}

run "cuda backend suite" 120 "$BIN/test_backend_cuda"
# Several slabs: every test pool fits one 16 GiB slab, so the slab size is
# lowered (KVS_CUDA_SLAB_BYTES, a multiple of the 2 MiB granularity): the
# suite with 2 MiB slabs, and the daemon path with 10 MiB slabs and 24 KiB
# slots (head_dim 96), which straddle slab boundaries (39 slabs, 39 fds in one
# SCM_RIGHTS message).
run "cuda backend suite, 2 MiB slabs" 120 env KVS_CUDA_SLAB_BYTES=2097152 "$BIN/test_backend_cuda"
run "daemon to two workers, tiny geometry" 60 "$BIN/test_cuda_share"
# Llama-3.1-8B's shape: 2 MiB blocks, 256 of them written by one worker and
# read back by another through the daemon.
run "daemon to two workers, llama-3.1-8b geometry, 256 blocks" 120 "$BIN/test_cuda_share" \
    --blocks 256 --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16 --block-tokens 16
run "daemon to two workers, 39 slabs of 10 MiB, slots across slab boundaries" 120 \
    env KVS_CUDA_SLAB_BYTES=10485760 "$BIN/test_cuda_share" \
    --blocks 256 --layers 32 --kv-heads 8 --head-dim 96 --dtype bf16 --block-tokens 16
if [ -n "$uuid" ]; then
    run "daemon to two workers, CUDA_VISIBLE_DEVICES=$uuid" 60 \
        env CUDA_VISIBLE_DEVICES="$uuid" "$BIN/test_cuda_share"
else
    step "daemon to two workers, CUDA_VISIBLE_DEVICES=<uuid>"
    if [ $gpu_visible = 1 ] && [ $fake = 0 ]; then
        echo "-- FAILED (a GPU is visible but nvidia-smi gave no UUID)"
        failed=1
    else
        echo "-- not run: no device UUID (nvidia-smi absent or the stand-in driver)"
    fi
fi
# PyTorch: a writer process fills pool blocks through tensor views (zero
# copy over the device pointer), a reader reuses them and must match its own
# full computation bitwise. On the GPU machine python3 is the one with CUDA
# PyTorch; the rehearsal has CPU PyTorch (Debian's, /usr/bin/python3) and runs
# it on the host backend, since the stand-in driver's memory is not a tensor.
if [ $fake = 1 ]; then
    run "PyTorch on shared blocks (host backend, rehearsal)" 240 /usr/bin/python3 \
        tests/client/torch_share.py --kvshared "$BIN/kvshared" --lib "$PACK_DIR/lib/libkvshare.so" \
        --backend host
else
    run "PyTorch on shared blocks (cuda backend, tensors on the GPU)" 240 "${PYTHON:-python3}" \
        tests/client/torch_share.py --kvshared "$BIN/kvshared" --lib "$PACK_DIR/lib/libkvshare.so" \
        --backend cuda
fi
# The stand-in driver copies with memmove: the rehearsal's figures mean
# nothing, so it runs the short version.
run "block copy bandwidth" 120 "$BIN/bench_copy" $([ $fake = 1 ] && echo --quick)
# Tier 2 on the cuda backend (test_tier picks the backend from
# KVS_TEST_TIER_BACKEND), then the copy bench: on the stand-in driver a short
# run that only shows the copies and their check work (its copies are
# memmoves: the figures mean nothing); on a GPU 4k-token prefixes, one thread
# and four.
run "tier 2 on the cuda backend (test_tier, kvshared --backend cuda --host-tier)" 240 \
    env KVS_TEST_TIER_BACKEND=cuda "$BIN/test_tier"
run "tier 2 on the cuda backend, gather kernel forced (KVS_CUDA_COPY=kernel)" 240 \
    env KVS_TEST_TIER_BACKEND=cuda KVS_CUDA_COPY=kernel "$BIN/test_tier"
# The tier-copy bench per copy path: the engine, the kernel, and the choice
# the backend makes by itself (which its detail line names).
if [ $fake = 1 ]; then
    tier_args="--tokens 256 --rounds 1 --threads 2"
    tier_what="stand-in driver: figures mean nothing"
else
    tier_args="--tokens 4096 --rounds 5 --threads 1"
    tier_what="4k-token llama-3.1-8b prefixes, 1 thread"
fi
for copy in engine kernel; do
    # shellcheck disable=SC2086
    run "tier-copy bench, cuda backend, KVS_CUDA_COPY=$copy ($tier_what)" 120 \
        env KVS_CUDA_COPY=$copy "$BIN/kvshare-bench" tier-copy --backend cuda $tier_args
done
if [ $fake = 0 ]; then
    run "tier-copy bench, cuda backend, automatic choice, 4k-token prefixes, 4 threads" 120 \
        "$BIN/kvshare-bench" tier-copy --backend cuda --tokens 4096 --rounds 5 --threads 4
fi
# The disk tier under a GPU pool. Its file must be on a file system with
# O_DIRECT (not tmpfs): the packed folder's own.
mkdir -p "$PACK_DIR/tmp"
run "disk tier on the cuda backend (test_tier_disk3, kvshared --backend cuda)" 240 \
    env TMPDIR="$PACK_DIR/tmp" KVS_TEST_TIER_BACKEND=cuda "$BIN/test_tier_disk3"
# The reference worker's share through a promoted block: pushed to tier 2,
# then through the disk, between the writer and the reader.
for tier in host disk; do
    if [ $fake = 1 ]; then
        run "PyTorch through tier $tier (host backend, rehearsal)" 240 env TMPDIR="$PACK_DIR/tmp" \
            /usr/bin/python3 tests/client/torch_share.py --kvshared "$BIN/kvshared" \
            --lib "$PACK_DIR/lib/libkvshare.so" --backend host --through-tier $tier
    else
        run "PyTorch through tier $tier (cuda backend, tensors on the GPU)" 240 \
            env TMPDIR="$PACK_DIR/tmp" "${PYTHON:-python3}" tests/client/torch_share.py \
            --kvshared "$BIN/kvshared" --lib "$PACK_DIR/lib/libkvshare.so" --backend cuda \
            --through-tier $tier
    fi
done
run "geometry" 30 "$BIN/test_geometry"
run "free stack" 30 "$BIN/test_pool"
run "capacity planner arithmetic" 30 "$BIN/test_calc"
run "host backend" 60 "$BIN/test_backend_host"
run "kvshare calc" 30 sh tests/gpu/calc_cli.sh "$BIN/kvshare"

step "figures"
echo "FIGURES (every measured line of this run, for docs/GPU.md)"
grep -E '^(== (block copy|tier-copy)|bench_copy:|llama|  (one cuMemcpy|block copy via|best pipelined|gather kernel not)|tier-copy:|(demote|promote|dtoh|htod)_gbps|demote_vs|promote_vs|copy path:|cuda backend:)' \
    "$LOG" | head -120

step "done"
if [ $failed -ne 0 ]; then
    echo "RESULT: FAILED"
    exit 1
fi
if [ $skipped -ne 0 ]; then
    echo "RESULT: passed, GPU tests SKIPPED (no GPU visible)"
    exit 77
fi
echo "RESULT: all passed"
exit 0
