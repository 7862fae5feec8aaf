# SPDX-License-Identifier: Apache-2.0
"""PyTorch on shared pool blocks, end to end, across processes.

    torch_share.py --kvshared PATH --lib PATH [--backend host|cuda]
                   [--device cpu|cuda] [--dtype fp32,bf16] [--daemon-arg ARG ...]
                   [--through-tier host|disk]

Starts a real kvshared on a temporary socket, then two worker processes:

  writer  computes the keys and values of a prompt with a small model of
          random-weight attention layers (seeded; one layer per pool layer),
          writes them into freshly allocated pool blocks through tensors that
          are views of the pool memory at kvs_block_addr (no staging buffer),
          commits the prompt and exits;
  reader  looks the prompt up, gets a hit for every block of it, builds its
          KV cache from the whole pool seen as one tensor
          [layer][k|v][block][token][kv_head][head_dim] (geometry and strides
          from Hello) indexed by the block table, and runs a continuation on
          it. That output must equal, bit for bit, the output of the same
          continuation over KV the reader computes from the whole prompt
          itself with the same ops on the same device; the pool's K and V must
          equal that recomputed K and V bit for bit; the shared path must not
          have run the prompt through the model; a full forward pass over
          prompt + continuation must agree within rounding; and changing one
          value in the pool must change the output (then restoring it must
          restore it).

With --through-tier, the prompt's blocks leave the pool between the two
workers: kvshared runs with a host tier (host), or a small host tier and a
disk tier (disk, a file in a new directory under $TMPDIR, which must be on a
file system with O_DIRECT), and the driver commits filler prompts in another
namespace until the Tree shows every block of the prompt below the pool (for
disk: none of them in tier 2 either). The reader's pinned lookup then brings
them back up (its counters must show the promotions, or the disk reads), and
everything above must still hold bit for bit: the bytes went device -> host
(-> disk) -> device through the backend's tier copies.

Tensors over the pool are zero-copy (kvshare.tensors.pool_tensor): on the host
backend torch.frombuffer over the mapped memory, on cuda torch.as_tensor of an
object exposing __cuda_array_interface__ at the device pointer (the library
maps the pool into the process's primary context, the one PyTorch uses). Each view's data_ptr is
checked against the address the library gives.

Exit status: 0 passed, 1 failed, 77 skipped (PyTorch missing, or without CUDA
for --device cuda; the reason is printed), 2 bad usage. The paths may also come
from the environment: KVSHARED (or KVS_KVSHARED) and KVSHARE_LIB. libkvshare's
own dependencies must be found by the dynamic loader (LD_LIBRARY_PATH).
"""
import argparse
import os
import random
import shutil
import subprocess
import tempfile
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import kvsd  # noqa: E402
import kvshare  # noqa: E402
import kvshare.tensors  # noqa: E402

PASS, FAIL, SKIP = 0, 1, 77

# Daemon geometry: small enough for a CPU in CI, shaped like a real model's
# (grouped-query attention, several layers, several blocks per prompt).
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS, POOL_BLOCKS = 2, 2, 32, 16, 64
PROMPT_BLOCKS = 3
CONTINUATION = 7  # tokens after the prompt (less than a block: never cached)
VOCAB = 512
QUERY_GROUP = 2  # query heads per KV head

TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)
    print("  ok: " + what, flush=True)


# -- the model ---------------------------------------------------------------

class Model:
    """Stacked causal attention layers with random weights, no MLP or norm:
    x = embed(token) + pos(position); per layer x += attn(x). Each layer's K
    and V for a token are [kv_heads, head_dim], as the pool stores them.
    `projected` counts the tokens whose K/V this model has computed."""

    def __init__(self, torch, geo, seed, device, dtype, positions=None):
        self.t = torch
        self.layers, self.kv_heads, self.head_dim = geo["layers"], geo["kv_heads"], geo["head_dim"]
        self.heads = self.kv_heads * QUERY_GROUP
        d = self.heads * self.head_dim
        g = torch.Generator().manual_seed(seed)

        def param(*shape, scale=1.0):
            # Drawn on the CPU in float32, so every process and device starts
            # from the same bits, then moved and rounded once.
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        self.embed = param(VOCAB, d)
        self.pos = param(positions or PROMPT_BLOCKS * geo["block_tokens"] + CONTINUATION, d,
                         scale=0.5)
        s = d ** -0.5
        self.w = [dict(q=param(d, d, scale=s),
                       k=param(d, self.kv_heads * self.head_dim, scale=s),
                       v=param(d, self.kv_heads * self.head_dim, scale=s),
                       o=param(d, d, scale=s)) for _ in range(self.layers)]
        self.device, self.dtype = device, dtype
        self.projected = 0

    def _attend(self, x, w, past_k, past_v, start):
        """One layer for the tokens of x at positions start..: returns the
        layer's output and the new tokens' K and V ([T, kv_heads, head_dim])."""
        t = self.t
        n = x.shape[0]
        q = (x @ w["q"]).view(n, self.heads, self.head_dim)
        k = (x @ w["k"]).view(n, self.kv_heads, self.head_dim)
        v = (x @ w["v"]).view(n, self.kv_heads, self.head_dim)
        self.projected += n
        keys = k if past_k is None else t.cat([past_k, k])
        vals = v if past_v is None else t.cat([past_v, v])
        keys = self._per_query_head(keys)  # [heads, S, head_dim]
        vals = self._per_query_head(vals)
        scores = (q.transpose(0, 1) @ keys.transpose(1, 2)) * (self.head_dim ** -0.5)
        q_pos = t.arange(start, start + n, device=self.device).view(n, 1)
        k_pos = t.arange(0, start + n, device=self.device).view(1, start + n)
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out = (t.softmax(scores, dim=-1) @ vals).transpose(0, 1).reshape(n, -1)
        return out @ w["o"], k, v

    def _per_query_head(self, kv):
        """[S, kv_heads, D] -> [heads, S, D], each KV head serving QUERY_GROUP
        query heads (expand, not repeat_interleave: no cumsum on the device)."""
        s = kv.shape[0]
        return (kv.unsqueeze(2).expand(s, self.kv_heads, QUERY_GROUP, self.head_dim)
                .reshape(s, self.heads, self.head_dim).transpose(0, 1))

    def _input(self, tokens, start):
        ids = self.t.tensor(tokens, dtype=self.t.long, device=self.device)
        return self.embed[ids] + self.pos[start:start + len(tokens)]

    def prefill(self, tokens):
        """Hidden states of tokens from position 0, and each layer's K and V."""
        x = self._input(tokens, 0)
        ks, vs = [], []
        for w in self.w:
            out, k, v = self._attend(x, w, None, None, 0)
            ks.append(k)
            vs.append(v)
            x = x + out
        return x, ks, vs

    def extend(self, tokens, past_k, past_v):
        """Hidden states of tokens that follow a prefix whose per-layer K and V
        ([P, kv_heads, head_dim] each) are given."""
        start = past_k[0].shape[0]
        x = self._input(tokens, start)
        for layer, w in enumerate(self.w):
            out, _, _ = self._attend(x, w, past_k[layer], past_v[layer], start)
            x = x + out
        return x


def prompt_tokens(seed, block_tokens):
    rng = random.Random(seed)
    n = PROMPT_BLOCKS * block_tokens
    prompt = [rng.randrange(VOCAB) for _ in range(n)]
    return prompt, [rng.randrange(VOCAB) for _ in range(CONTINUATION)]


# -- tensors over pool memory ------------------------------------------------

def pool_tensor(torch, addr, nbytes, shape, byte_strides, dtype, device):
    """A tensor over pool memory (kvshare.tensors.pool_tensor), a Failure
    when it cannot be one."""
    try:
        return kvshare.tensors.pool_tensor(torch, addr, nbytes, shape, byte_strides, dtype,
                                           device)
    except ValueError as e:
        raise Failure(str(e))


def slot_tensor(torch, client, geo, layer, kv, block, dtype, device):
    """[block_tokens, kv_heads, head_dim] over one block's K (kv=0) or V slot."""
    addr = client.block_addr(layer, kv, block)
    e = geo["dtype_bytes"]
    shape = (geo["block_tokens"], geo["kv_heads"], geo["head_dim"])
    strides = (geo["kv_heads"] * geo["head_dim"] * e, geo["head_dim"] * e, e)
    return pool_tensor(torch, addr, geo["slot_bytes"], shape, strides, dtype, device)


def whole_pool(torch, client, geo, dtype, device):
    """The pool as [layer][k|v][block][token][kv_head][head_dim]."""
    e = geo["dtype_bytes"]
    shape = (geo["layers"], 2, geo["num_blocks"], geo["block_tokens"], geo["kv_heads"],
             geo["head_dim"])
    strides = (geo["layer_stride"], geo["kv_stride"], geo["block_stride"],
               geo["kv_heads"] * geo["head_dim"] * e, geo["head_dim"] * e, e)
    return pool_tensor(torch, client.pool_base, geo["pool_bytes"], shape, strides, dtype, device)


def bits(torch, x):
    """x reinterpreted as integers of its size, for bitwise comparison."""
    return x.contiguous().view({4: torch.int32, 2: torch.int16}[x.element_size()])


def same_bits(torch, a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(torch, a), bits(torch, b))


def raw_bytes(torch, x):
    return bits(torch, x).cpu().numpy().tobytes()


# -- the two workers ---------------------------------------------------------

def worker_setup(args):
    # Deterministic cuBLAS needs a fixed workspace, set before its first use.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.cuda.init()  # like an engine: PyTorch owns the device before kvshare maps into it
    else:
        torch.set_num_threads(1)  # same kernels in both processes, whatever the machine's load
    client = kvshare.Client(socket_path=args.socket, timeout_ms=20000, worker_name=args.role,
                            lib=args.lib)
    geo = client.geometry
    print("%s: pid %d, torch %s on %s, pool %s %s, %d layers x %d kv heads x %d, "
          "%d tokens per block"
          % (args.role, os.getpid(), torch.__version__, device, geo["backend"], geo["dtype"],
             geo["layers"], geo["kv_heads"], geo["head_dim"], geo["block_tokens"]), flush=True)
    if geo["dtype"] not in TORCH_DTYPES:
        raise Failure("pool dtype %s has no torch dtype here" % geo["dtype"])
    check(geo["backend"] == args.backend, "the pool's backend is %s" % args.backend)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print("%s: torch device %s (uuid %s); pool device uuid %s" % (
            args.role, props.name, getattr(props, "uuid", "?"), geo["device_uuid"].hex()))
    dtype = getattr(torch, TORCH_DTYPES[geo["dtype"]])
    model = Model(torch, geo, args.seed, device, dtype)
    return torch, device, dtype, client, geo, model


def writer(args):
    torch, device, dtype, client, geo, model = worker_setup(args)
    prompt, _ = prompt_tokens(args.seed, geo["block_tokens"])
    n = len(prompt) // geo["block_tokens"]
    check(client.lookup(prompt) == [], "the prompt is not cached yet")
    _, ks, vs = model.prefill(prompt)
    # Blocks out of allocation order, so that only the block table says where
    # each part of the prompt lives.
    got = client.alloc(n + 1)
    table, spare = got[::-1][:n], got[::-1][n:]
    client.release(spare)
    bt = geo["block_tokens"]
    for i, block in enumerate(table):
        for layer in range(geo["layers"]):
            for kv, src in ((0, ks[layer]), (1, vs[layer])):
                view = slot_tensor(torch, client, geo, layer, kv, block, dtype, device)
                view.copy_(src[i * bt:(i + 1) * bt])
    if device.type == "cuda":
        torch.cuda.synchronize()  # the copies are queued; commit only what is written
    print("writer: wrote %d blocks %s through views of the pool" % (n, table), flush=True)
    # The library's own copy path sees the bytes the views wrote.
    for i, block in enumerate(table):
        for layer in range(geo["layers"]):
            for kv, src in ((0, ks[layer]), (1, vs[layer])):
                want = raw_bytes(torch, src[i * bt:(i + 1) * bt])
                if client.block_read(layer, kv, block) != want:
                    raise Failure("block %d layer %d %s: kvs_block_read differs from what the "
                                  "view wrote" % (block, layer, "KV"[kv]))
    check(True, "kvs_block_read returns every slot the views wrote")
    check(client.commit(prompt, table) == table, "commit kept the writer's blocks")
    client.close()


def reader(args):
    torch, device, dtype, client, geo, model = worker_setup(args)
    prompt, continuation = prompt_tokens(args.seed, geo["block_tokens"])
    bt = geo["block_tokens"]
    n = len(prompt) // bt
    table = client.lookup(prompt + continuation, pin=True)
    check(len(table) == n, "lookup of prompt + continuation hits all %d prompt blocks (got %d)"
          % (n, len(table)))

    pool = whole_pool(torch, client, geo, dtype, device)
    for layer in range(geo["layers"]):
        for kv in (0, 1):
            for block in table:
                addr = client.block_addr(layer, kv, block)
                if pool[layer, kv, block].data_ptr() != addr:
                    raise Failure("pool[%d, %d, %d] at 0x%x, kvs_block_addr says 0x%x" % (
                        layer, kv, block, pool[layer, kv, block].data_ptr(), addr))
    check(True, "the pool tensor's strides put every block where kvs_block_addr says")
    index = torch.tensor(table, dtype=torch.long, device=device)

    def shared_kv():
        # Paged read: the block table picks blocks out of each layer's pool.
        ks = [pool[layer, 0].index_select(0, index).reshape(n * bt, geo["kv_heads"],
                                                            geo["head_dim"])
              for layer in range(geo["layers"])]
        vs = [pool[layer, 1].index_select(0, index).reshape(n * bt, geo["kv_heads"],
                                                            geo["head_dim"])
              for layer in range(geo["layers"])]
        return ks, vs

    model.projected = 0
    pk, pv = shared_kv()
    shared = model.extend(continuation, pk, pv)
    check(model.projected == len(continuation) * geo["layers"],
          "the shared path projected only the %d continuation tokens per layer"
          % len(continuation))

    # The reference: the same ops, with the prompt's KV computed here.
    _, rk, rv = model.prefill(prompt)
    reference = model.extend(continuation, rk, rv)
    for layer in range(geo["layers"]):
        check(same_bits(torch, pk[layer], rk[layer]) and same_bits(torch, pv[layer], rv[layer]),
              "layer %d: the pool's K and V equal the recomputed ones bitwise" % layer)
    diff = (shared.float() - reference.float()).abs().max().item()
    check(same_bits(torch, shared, reference),
          "continuation output over shared blocks equals the recomputed one bitwise "
          "(max |diff| %g)" % diff)
    check(reference.abs().max().item() > 0, "the output is not all zeros")

    # The continuation logic itself: one pass over the whole sequence agrees.
    full, _, _ = model.prefill(prompt + continuation)
    # (Other shapes, other kernels: equal within rounding, not bitwise.)
    scale = max(1.0, reference.float().abs().max().item())
    tol = {torch.float32: 1e-4, torch.bfloat16: 6e-2}[dtype] * scale
    err = (full[len(prompt):].float() - reference.float()).abs().max().item()
    check(err <= tol, "a full forward pass agrees within %.3g (max |diff| %g)" % (tol, err))

    # Negative control: the output is read from the pool.
    last = geo["layers"] - 1
    cell = pool[last, 1, table[-1], bt - 1, 0]
    saved = cell.clone()
    cell.add_(1.0)
    ck, cv = shared_kv()
    corrupted = model.extend(continuation, ck, cv)
    check(not same_bits(torch, corrupted, reference),
          "one changed value in a pool block changes the output (max |diff| %g)"
          % (corrupted.float() - reference.float()).abs().max().item())
    cell.copy_(saved)
    rk2, rv2 = shared_kv()
    check(same_bits(torch, model.extend(continuation, rk2, rv2), reference),
          "restoring it restores the output")
    if device.type == "cuda":
        torch.cuda.synchronize()
    check(client.release(table) == n, "released the %d pins" % n)
    client.close()


# -- the lower tiers ------------------------------------------------------------

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
TIER2_BLOCKS = 24       # host tier, in blocks, with --through-tier host
TIER2_BLOCKS_DISK = 8   # a small one with a disk tier below it
DISK_TIER_BYTES = 4 << 20
FILLER_BLOCKS = 8       # per filler prompt
MAX_FILLERS = 200


def tier_flags(tier, dtype):
    """kvshared flags for --through-tier, and the disk tier's directory (to
    remove) or None."""
    if tier == "none":
        return [], None
    block = 2 * LAYERS * KV_HEADS * HEAD_DIM * BLOCK_TOKENS * DTYPE_BYTES[dtype]
    if tier == "host":
        return ["--host-tier", str(TIER2_BLOCKS * block)], None
    d = tempfile.mkdtemp(prefix="kvs-torch-disk-")
    return ["--host-tier", str(TIER2_BLOCKS_DISK * block), "--disk-tier-path",
            os.path.join(d, "tier3"), "--disk-tier-bytes", str(DISK_TIER_BYTES)], d


def prompt_row(client, prompt_len):
    """The Tree row of the writer's prompt (namespace default), or None."""
    for row in client.tree(ns="default", max_rows=100):
        if row["tokens"] == prompt_len:
            return row
    return None


def ns_row(stats, name):
    for row in stats["namespaces"]:
        if row["name"] == name:
            return row
    return {"tier2_blocks": 0}


def push_down(args, socket_path, tier):
    """Commits filler prompts in namespace "filler" until the writer's prompt
    is wholly below the pool (tier 2 for host; tier 3 for disk: below the
    pool and none in tier 2). Returns the counters before the reader runs."""
    if tier == "none":
        return None
    client = kvshare.Client(socket_path=socket_path, timeout_ms=20000, worker_name="filler",
                            lib=args.lib)
    try:
        bt = client.geometry["block_tokens"]
        prompt_len = PROMPT_BLOCKS * bt
        for i in range(MAX_FILLERS):
            row = prompt_row(client, prompt_len)
            if row is None:
                raise Failure("the writer's prompt left the node while filling (tiers too small?)")
            below = row["tier2_blocks"]
            in_tier2 = ns_row(client.stats(), "default")["tier2_blocks"]
            if below == PROMPT_BLOCKS and (tier == "host" or in_tier2 == 0):
                want = 2 if tier == "host" else 3
                check(row["tier"] == want, "the Tree row names tier %d for the prompt's last "
                      "block (got %d)" % (want, row["tier"]))
                print("driver: after %d filler prompts the prompt's %d blocks are in %s"
                      % (i, PROMPT_BLOCKS, "tier 2" if tier == "host" else "tier 3"), flush=True)
                return client.stats()
            tokens = [VOCAB + i * FILLER_BLOCKS * bt + k for k in range(FILLER_BLOCKS * bt)]
            ids = client.alloc(FILLER_BLOCKS, ns="filler")
            client.commit(tokens, ids, ns="filler")
            client.release(ids)
        raise Failure("the prompt was not pushed down to %s after %d filler prompts (row %s)"
                      % (tier, MAX_FILLERS, prompt_row(client, prompt_len)))
    finally:
        client.close()


def check_came_up(args, socket_path, tier, before):
    """The reader's hits came from the lower tier: the daemon's counters
    show the promotions (and, for disk, the reads from the disk)."""
    if tier == "none":
        return
    client = kvshare.Client(socket_path=socket_path, timeout_ms=20000, worker_name="check",
                            lib=args.lib)
    try:
        after = client.stats()
    finally:
        client.close()
    name = "tier_promotions" if tier == "host" else "disk_reads"
    got = after[name] - before[name]
    check(got >= PROMPT_BLOCKS, "the reader's lookup brought the %d blocks up from %s (%s +%d)"
          % (PROMPT_BLOCKS, "tier 2" if tier == "host" else "the disk", name, got))


# -- the driver ----------------------------------------------------------------

def start_daemon(kvshared, backend, dtype, extra=()):
    """kvshared with this check's geometry (tests/support/kvsd.py starts it:
    READY on --ready-fd within a deadline). Raises Failure when it does not
    start."""
    try:
        return kvsd.Daemon(blocks=POOL_BLOCKS, kvshared=kvshared, backend=backend,
                           geometry={"layers": LAYERS, "kv_heads": KV_HEADS,
                                     "head_dim": HEAD_DIM, "dtype": dtype,
                                     "block_tokens": BLOCK_TOKENS}, extra=extra)
    except RuntimeError as e:
        raise Failure(str(e))


def run_worker(args, role, socket, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", socket,
           "--lib", args.lib, "--backend", args.backend, "--device", args.device,
           "--seed", str(args.seed)]
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        raise Failure("%s did not finish within %d s" % (role, timeout))
    if rc != 0:
        raise Failure("%s exited with %d" % (role, rc))
    print("%s: passed in %.1f s" % (role, time.monotonic() - t0), flush=True)


def drive(args):
    try:
        import torch
    except ImportError as e:
        print("skipped: PyTorch is not importable by %s: %s" % (sys.executable, e))
        return SKIP
    if args.device == "cuda" and not torch.cuda.is_available():
        print("skipped: torch %s (%s) has no CUDA device" % (torch.__version__, sys.executable))
        return SKIP
    for name, path in (("kvshared", args.kvshared), ("libkvshare", args.lib)):
        if not path or not os.path.isfile(path):
            print("FAILED: %s not found at %r (give --kvshared/--lib or set KVSHARED/KVSHARE_LIB)"
                  % (name, path))
            return FAIL
    print("torch %s, %s backend, tensors on %s" % (torch.__version__, args.backend, args.device))
    for dtype in args.dtype.split(","):
        if dtype not in TORCH_DTYPES:
            print("FAILED: unknown --dtype %r (fp32, bf16)" % dtype)
            return FAIL
        print("== %s" % dtype, flush=True)
        daemon = None
        disk_dir = None
        try:
            extra, disk_dir = tier_flags(args.through_tier, dtype)
            daemon = start_daemon(args.kvshared, args.backend, dtype,
                                  (args.daemon_arg or []) + extra)
            run_worker(args, "writer", daemon.socket, args.timeout)
            before = push_down(args, daemon.socket, args.through_tier)
            run_worker(args, "reader", daemon.socket, args.timeout)
            check_came_up(args, daemon.socket, args.through_tier, before)
            log = daemon.log()
            rc = daemon.stop()
            daemon = None
            if rc != 0:
                raise Failure("kvshared exited with %d: %s" % (rc, log))
        except (Failure, kvshare.KvsError) as e:
            print("FAILED (%s): %s" % (dtype, e))
            if daemon is not None:
                print("kvshared log:\n" + daemon.log())
                daemon.stop()
            return FAIL
        finally:
            if disk_dir:
                shutil.rmtree(disk_dir, ignore_errors=True)
    print("PASSED: blocks written by one process were read by another through tensor views, "
          "bitwise equal to recomputing (%s%s)"
          % (args.dtype, "" if args.through_tier == "none"
             else ", through tier %s and back" % args.through_tier))
    return PASS


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kvshared", default=os.environ.get("KVSHARED")
                   or os.environ.get("KVS_KVSHARED"), help="the daemon binary")
    p.add_argument("--lib", default=os.environ.get("KVSHARE_LIB"), help="libkvshare.so")
    p.add_argument("--backend", choices=("host", "cuda"), default="host")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="where tensors live (default: cuda for the cuda backend, else cpu)")
    p.add_argument("--dtype", default="fp32,bf16", help="pool dtypes to run, comma separated")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=int, default=300, help="seconds per worker process")
    p.add_argument("--daemon-arg", action="append", help="extra kvshared flag (repeatable)")
    p.add_argument("--through-tier", choices=("none", "host", "disk"), default="none",
                   help="push the prompt's blocks down to this tier between writer and reader")
    p.add_argument("--role", choices=("writer", "reader"), help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device is None:
        args.device = "cuda" if args.backend == "cuda" else "cpu"
    if args.backend != args.device.replace("cpu", "host"):
        p.error("--backend %s needs --device %s: pool memory is only viewed where it lives"
                % (args.backend, "cuda" if args.backend == "cuda" else "cpu"))
    if args.role is None:
        return drive(args)
    try:
        (writer if args.role == "writer" else reader)(args)
    except (Failure, kvshare.KvsError) as e:
        print("%s: FAILED: %s" % (args.role, e), flush=True)
        return FAIL
    return PASS


if __name__ == "__main__":
    sys.exit(main())
