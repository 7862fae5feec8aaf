# SPDX-License-Identifier: Apache-2.0
"""PyTorch tensors over pool memory, and block copies between an engine's KV
tensors and pool blocks.

The pool is laid out [layer][k|v][block][token][kv_head][head_dim] (strides
from Hello), so for one layer and one of K or V the blocks are rows of
slot_bytes bytes: pool_rows() is that (num_blocks, slot_bytes) uint8 tensor,
a view of the mapped pool (no copy). On the host backend it is built with
torch.frombuffer over the mapping; on cuda with torch.as_tensor of an object
exposing __cuda_array_interface__ at the device pointer.

A BlockCopier holds pairs (engine rows, pool rows), one per layer and K or V,
and copies lists of blocks between them, merging runs of blocks that are
consecutive on both sides; on the CPU with memmove, on a device with one
gather and one scatter per pair (BlockCopier says why).

PyTorch is imported when a function needs it, so `import kvshare.tensors`
works without it.
"""
import ctypes

__all__ = ["pool_tensor", "pool_rows", "BlockCopier", "StreamOrder"]


class _DeviceArray:
    """Unowned device memory described by __cuda_array_interface__ (strides in
    bytes); torch.as_tensor wraps it without copying."""

    def __init__(self, addr, shape, strides, typestr):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "strides": tuple(strides), "typestr": typestr,
            "data": (addr, False), "version": 2,
        }


def pool_tensor(torch, addr, nbytes, shape, byte_strides, dtype, device):
    """A tensor of `dtype` with `shape` and `byte_strides` over the pool
    memory at addr (nbytes from there are mapped), sharing that memory.
    Raises ValueError when a stride is not a multiple of the element size or
    the tensor does not start at addr."""
    size = torch.tensor([], dtype=dtype).element_size()
    if any(s % size for s in byte_strides):
        raise ValueError("pool strides %r are not multiples of the element size %d"
                         % (byte_strides, size))
    if torch.device(device).type == "cuda":
        # __cuda_array_interface__ has no bfloat16: wrap as same-size ints, then reinterpret.
        typestr = {1: "|u1", 4: "<f4", 2: "<i2"}[size]
        raw = torch.as_tensor(_DeviceArray(addr, shape, byte_strides, typestr), device=device)
        out = raw.view(dtype)
    else:
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        flat = torch.frombuffer(buf, dtype=dtype)
        out = flat.as_strided(tuple(shape), tuple(s // size for s in byte_strides))
    if out.data_ptr() != addr:
        raise ValueError("tensor at 0x%x, the pool memory at 0x%x: not a view"
                         % (out.data_ptr(), addr))
    return out


def pool_rows(torch, client, layer, kv, device="cpu"):
    """(num_blocks, slot_bytes) uint8 view of layer's K (kv=0) or V (kv=1)
    blocks in the mapped pool of client (a kvshare.Client)."""
    geo = client.geometry
    addr = client.block_addr(layer, kv, 0)
    n, slot, stride = geo["num_blocks"], geo["slot_bytes"], geo["block_stride"]
    return pool_tensor(torch, addr, (n - 1) * stride + slot, (n, slot), (stride, 1),
                       torch.uint8, device)


def _runs(src, dst):
    """[(src0, dst0, length)]: the pairs (src[i], dst[i]) cut into runs that
    are consecutive on both sides."""
    runs = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1][2] += 1
        else:
            runs.append([s, d, 1])
    return runs


class _Rows:
    """One side of a pair: a 2-D uint8 tensor whose rows are blocks, and,
    for CPU tensors, its address and row stride in bytes."""

    def __init__(self, t):
        if t.dim() != 2 or t.stride(1) != 1 or t.element_size() != 1:
            raise ValueError("block rows must be a 2-D byte tensor with contiguous rows, not "
                             "%s of shape %s, strides %s" % (t.dtype, tuple(t.shape), t.stride()))
        self.t = t
        self.n = t.shape[0]
        self.addr = t.data_ptr()
        self.stride = t.stride(0)


class BlockCopier:
    """Copies blocks between engine tensors and pool rows.

    pairs: [(engine_rows, pool_rows)], each a 2-D uint8 tensor whose rows are
    blocks (any row stride, contiguous rows), the engine's rows engine_bytes
    long and the pool's factor x engine_bytes long: one pool block holds
    `factor` consecutive engine blocks (vLLM's block_size_factor).

    A transfer is cut into runs of blocks consecutive on both sides. How the
    runs are copied (method):
      "memmove"  CPU tensors: one memmove per run and pair, or per block of a
                 run whose rows are not back to back (ctypes.memmove, which
                 releases the GIL); a few hundred ns of Python per call, where
                 a torch slice and copy_ cost several µs. The default on CPU.
      "index"    one gather (index_select) and one scatter (index_copy_) per
                 pair for the whole transfer, whatever its runs: a fixed
                 number of kernel launches, where one copy per block would
                 launch thousands. The default for device tensors.
      "slices"   copy_ of one slice per run and pair (any device).
    Every block index is checked against its tensor before anything is
    copied (ValueError)."""

    METHODS = ("memmove", "index", "slices")

    def __init__(self, pairs, factor=1, method=None):
        if factor < 1:
            raise ValueError("factor %d: must be >= 1" % factor)
        self.factor = factor
        self.pairs = []
        for eng, pool in pairs:
            if eng.dim() != 2 or pool.dim() != 2:
                raise ValueError("engine and pool rows must be 2-D (blocks, bytes)")
            if pool.shape[1] != eng.shape[1] * factor:
                raise ValueError("a pool block of %d bytes does not hold %d engine blocks of %d"
                                 % (pool.shape[1], factor, eng.shape[1]))
            # Pool rows seen at engine-block granularity: (num_blocks x factor, engine bytes).
            fine = pool.as_strided((pool.shape[0] * factor, eng.shape[1]),
                                   (pool.stride(0) // factor, 1)) \
                if factor > 1 and pool.stride(0) == pool.shape[1] else pool
            if factor > 1 and fine is pool:
                raise ValueError("pool rows with padding cannot be split into engine blocks")
            self.pairs.append((eng, fine))
        self.bytes_per_block = sum(p.shape[1] for _, p in self.pairs) * factor
        on_cpu = all(t.device.type == "cpu" for pair in self.pairs for t in pair)
        if method is None:
            method = "memmove" if on_cpu else "index"
        if method not in self.METHODS:
            raise ValueError("copy method %r: one of %s" % (method, ", ".join(self.METHODS)))
        if method == "memmove" and not on_cpu:
            raise ValueError("copy method memmove needs CPU tensors")
        self.method = method
        self._rows = [(_Rows(e), _Rows(p)) for e, p in self.pairs]
        if len({(e.n, p.n) for e, p in self._rows}) > 1:
            raise ValueError("engine (or pool) tensors with different numbers of blocks")

    def _expand(self, pool_blocks):
        f = self.factor
        return [b * f + j for b in pool_blocks for j in range(f)]

    @staticmethod
    def _check(rows, blocks, side):
        """Raises ValueError unless every index in blocks is a row of rows."""
        if blocks and (min(blocks) < 0 or max(blocks) >= rows.n):
            bad = min(blocks) if min(blocks) < 0 else max(blocks)
            raise ValueError("%s row %d out of range: the tensor has %d" % (side, bad, rows.n))

    def _copy(self, src, dst, to_pool):
        """Rows src[i] -> dst[i] of every pair, engine -> pool if to_pool."""
        eng, pool = self._rows[0]
        self._check(eng if to_pool else pool, src, "engine" if to_pool else "pool")
        self._check(pool if to_pool else eng, dst, "pool" if to_pool else "engine")
        if not src:
            return
        if self.method == "index":
            self._copy_index(src, dst, to_pool)
            return
        runs = _runs(src, dst)
        if self.method == "slices":
            for eng, pool in self.pairs:
                a, b = (eng, pool) if to_pool else (pool, eng)
                for s, d, n in runs:
                    b[d:d + n].copy_(a[s:s + n], non_blocking=True)
            return
        memmove = ctypes.memmove
        for eng, pool in self._rows:
            a, b = (eng, pool) if to_pool else (pool, eng)
            row = a.t.shape[1]
            sa, sb, aa, ab = a.stride, b.stride, a.addr, b.addr
            whole = sa == row and sb == row  # a run is one range on both sides
            for s, d, n in runs:
                if whole or n == 1:
                    memmove(ab + d * sb, aa + s * sa, n * row)
                else:
                    for i in range(n):
                        memmove(ab + (d + i) * sb, aa + (s + i) * sa, row)

    def _copy_index(self, src, dst, to_pool):
        import torch
        device = self.pairs[0][0].device
        si = torch.tensor(src, dtype=torch.int64, device=device)
        di = torch.tensor(dst, dtype=torch.int64, device=device)
        for eng, pool in self.pairs:
            a, b = (eng, pool) if to_pool else (pool, eng)
            b.index_copy_(0, di, a.index_select(0, si))

    def load(self, pool_blocks, engine_blocks, skip=0):
        """Engine block engine_blocks[i] <- pool sub-block skip + i (pool_blocks
        expanded by factor; skip < factor leaves out the start of the first
        pool block): len(engine_blocks) == factor x len(pool_blocks) - skip."""
        fine = self._expand(pool_blocks)[skip:]
        if len(fine) != len(engine_blocks):
            raise ValueError("%d pool blocks (skipping %d) hold %d engine blocks, %d given"
                             % (len(pool_blocks), skip, len(fine), len(engine_blocks)))
        self._copy(fine, [int(b) for b in engine_blocks], False)

    def store(self, engine_blocks, pool_blocks):
        """Pool sub-block i <- engine block engine_blocks[i]."""
        fine = self._expand(pool_blocks)
        if len(fine) != len(engine_blocks):
            raise ValueError("%d pool blocks hold %d engine blocks, %d given"
                             % (len(pool_blocks), len(fine), len(engine_blocks)))
        self._copy([int(b) for b in engine_blocks], fine, True)


class StreamOrder:
    """Orders a worker's copies against the engine's compute stream with CUDA
    events, as vLLM's own CPU offloader orders its transfers:

      mark()          in the engine's thread, when a transfer is submitted:
                      an event recorded on the engine's current stream (the
                      kernels that write a store's blocks, or still read a
                      load's destination blocks, are queued before it);
      run(mark, copy) in the copy thread: the copy stream waits for that
                      event (on the device: no host stall), copy() runs with
                      the copy stream current, an event is recorded after it
                      and the copy thread waits for that event alone, so a
                      store is committed and a transfer reported done only
                      once its bytes are in place.

    cuda: torch.cuda, or a stand-in with the same Event, Stream,
    current_stream and stream (the tests' recording driver); None for CPU
    tensors, which need no ordering (run() just copies)."""

    def __init__(self, cuda=None, device=None):
        self.cuda = cuda
        self.device = device
        self.stream = cuda.Stream(device=device) if cuda is not None else None

    @classmethod
    def for_device(cls, device):
        """The order for tensors on device: CUDA events on a cuda device,
        none on the CPU."""
        if getattr(device, "type", device) == "cuda":
            import torch
            return cls(torch.cuda, device)
        return cls()

    def mark(self):
        if self.cuda is None:
            return None
        event = self.cuda.Event()
        event.record(self.cuda.current_stream(self.device))
        return event

    def run(self, mark, copy):
        if self.cuda is None:
            return copy()
        if mark is not None:
            self.stream.wait_event(mark)
        with self.cuda.stream(self.stream):
            out = copy()
        done = self.cuda.Event()
        done.record(self.stream)
        done.synchronize()
        return out
