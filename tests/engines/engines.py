# SPDX-License-Identifier: Apache-2.0
"""What the engine plug-in tests and tools share: engine instances that make
vLLM's and SGLang's calls in the engines' order (as read from their sources),
their keys, their KV tensors, and the reference model of the PyTorch check
(tests/client/torch_share.py).

These are harnesses, not the engines: neither engine is installed here.
The call order they follow:

  vLLM (OffloadingConnectorScheduler / OffloadingConnectorWorker):
    scheduler: manager.lookup(hashes) (again at every scheduling step),
    manager.prepare_load(hits) -> spec; worker: handler.transfer_async(job,
    (spec, GPU spec)), get_finished() until the job is there; scheduler:
    manager.complete_load(hits). Stores: manager.prepare_store(hashes) ->
    PrepareStoreOutput; worker: transfer_async(job, (GPU spec, store spec)),
    get_finished(); scheduler: manager.complete_store(hashes, success).
  SGLang (HiCacheController prefetch and backup):
    batch_exists(keys) -> n; batch_get_v1(keys[:n], host_indices) -> [bool];
    batch_set_v1(keys, host_indices) -> [bool].
"""
import hashlib
import os
import struct
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "client"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import kvsd  # noqa: E402
import kvshare  # noqa: E402
import kvshare.sglang  # noqa: E402
import kvshare.vllm  # noqa: E402
import torch_share  # noqa: E402
Failure, check = torch_share.Failure, torch_share.check

# The geometry of the PyTorch check (2 layers, 2 KV heads, head_dim 32, 16
# tokens per block, 64 blocks), fp32; configure() changes it.
GEO = {"layers": torch_share.LAYERS, "kv_heads": torch_share.KV_HEADS,
       "head_dim": torch_share.HEAD_DIM, "block_tokens": torch_share.BLOCK_TOKENS}
POOL_BLOCKS = torch_share.POOL_BLOCKS
VOCAB = torch_share.VOCAB


def configure(layers, kv_heads, head_dim, pool_blocks):
    """Another geometry (for benchmarks), for daemon() and the instances."""
    global POOL_BLOCKS
    GEO.update(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    POOL_BLOCKS = pool_blocks


def daemon(kvshared, extra=()):
    """A kvshared (tests/support/kvsd.py) with a pool of GEO in fp32 and
    POOL_BLOCKS blocks on the host backend, extra flags after. Raises
    Failure when it does not start."""
    try:
        return kvsd.Daemon(blocks=POOL_BLOCKS, kvshared=kvshared,
                           geometry=dict(GEO, dtype="fp32"), extra=extra)
    except RuntimeError as e:
        raise Failure(str(e))


def prompt(seed, blocks, continuation=7):
    """A prompt of `blocks` full blocks and a continuation."""
    import random
    rng = random.Random(seed)
    n = blocks * GEO["block_tokens"]
    return ([rng.randrange(VOCAB) for _ in range(n)],
            [rng.randrange(VOCAB) for _ in range(continuation)])


def vllm_hashes(tokens, block_tokens):
    """Chained 32-byte block hashes in the manner of vLLM's sha256 hashing:
    each over the parent's hash and the block's tokens (a stand-in for
    sha256_cbor's exact encoding; what matters here is 32 chained bytes)."""
    out, parent = [], hashlib.sha256(b"vllm none hash").digest()
    for i in range(len(tokens) // block_tokens):
        block = tokens[i * block_tokens:(i + 1) * block_tokens]
        parent = hashlib.sha256(parent + struct.pack("<%dI" % len(block), *block)).digest()
        out.append(parent)
    return out


def sglang_keys(tokens, page_size):
    """SGLang's page keys: hex SHA-256 over the previous key's bytes and the
    page's token ids as 4-byte little-endian (mem_cache/utils.py)."""
    out, prior = [], b""
    for i in range(len(tokens) // page_size):
        page = tokens[i * page_size:(i + 1) * page_size]
        h = hashlib.sha256(prior + struct.pack("<%dI" % len(page), *page)).hexdigest()
        out.append(h)
        prior = bytes.fromhex(h)
    return out


def model(torch, seed=1234, positions=256):
    return torch_share.Model(torch, GEO, seed, torch.device("cpu"), torch.float32,
                             positions=positions)


def wait_for(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def ns_row(client, ns):
    for row in client.stats()["namespaces"]:
        if row["name"] == ns:
            return row
    return None


# -- vLLM ----------------------------------------------------------------------

def vllm_configs(socket, ns, head_dim=None, block_size=None, layers=None):
    """The parts of VllmConfig and KVCacheConfig the spec reads."""
    import torch
    extra = {"spec_name": "KvshareOffloadingSpec", "spec_module_path": "kvshare.vllm",
             "socket": socket, "namespace": ns, "timeout_ms": 2000}
    vcfg = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra))
    spec = SimpleNamespace(block_size=block_size or GEO["block_tokens"],
                           num_kv_heads=GEO["kv_heads"],
                           head_size=head_dim or GEO["head_dim"], dtype=torch.float32)
    names = ["model.layers.%d.self_attn" % i for i in range(layers or GEO["layers"])]
    kcfg = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=names,
                                                            kv_cache_spec=spec)])
    return vcfg, kcfg


class VllmInstance:
    """One vLLM engine with the kvshare offloading spec: a scheduler-side
    manager and worker-side handlers over its own paged KV cache, laid out
    as FlashAttention's (2, num_blocks, block_size, kv_heads, head_dim) per
    layer and handed to the spec split into K and V canonical tensors
    (num_blocks, page bytes), or, with joined=True, as FlashInfer's
    (num_blocks, 2, ...) with K and V in one page."""

    def __init__(self, socket, ns="vllm.test", gpu_blocks=16, joined=False, **geo):
        import torch
        self.torch = torch
        vcfg, kcfg = vllm_configs(socket, ns, **geo)
        self.spec = kvshare.vllm.KvshareOffloadingSpec(vcfg, kcfg)
        self.manager = self.spec.get_manager()
        bt, h, d = GEO["block_tokens"], GEO["kv_heads"], GEO["head_dim"]
        self.kv = []
        canonical = []
        for _ in range(len(kcfg.kv_cache_groups[0].layer_names)):
            if joined:
                t = torch.zeros(gpu_blocks, 2, bt, h, d)
                canonical.append(t.view(gpu_blocks, -1).view(torch.int8))
                self.kv.append(t.transpose(0, 1))
            else:
                t = torch.zeros(2, gpu_blocks, bt, h, d)
                canonical += [t[0].reshape(gpu_blocks, -1).view(torch.int8),
                              t[1].reshape(gpu_blocks, -1).view(torch.int8)]
                self.kv.append(t)
        handlers = {}
        for src, dst, handler in self.spec.get_handlers(SimpleNamespace(tensors=[
                SimpleNamespace(tensor=c, page_size_bytes=c.shape[1]) for c in canonical])):
            handlers[(src.medium(), dst.medium())] = handler
        self.store_handler = handlers[("GPU", "KVSHARE")]
        self.load_handler = handlers[("KVSHARE", "GPU")]
        self.job = 0
        self.lookups = 0

    def write_kv(self, blocks, ks, vs):
        """Puts a prompt's per-layer K and V ([T, heads, dim]) in GPU blocks."""
        bt = GEO["block_tokens"]
        for layer, kv in enumerate(self.kv):
            for i, b in enumerate(blocks):
                kv[0, b].copy_(ks[layer][i * bt:(i + 1) * bt])
                kv[1, b].copy_(vs[layer][i * bt:(i + 1) * bt])

    def read_kv(self, blocks):
        """Per-layer K and V of the given GPU blocks, as [T, heads, dim]."""
        ks = [kv[0, blocks].reshape(-1, GEO["kv_heads"], GEO["head_dim"]) for kv in self.kv]
        vs = [kv[1, blocks].reshape(-1, GEO["kv_heads"], GEO["head_dim"]) for kv in self.kv]
        return ks, vs

    def _run(self, handler, src, dst):
        self.job += 1
        job = self.job
        if not handler.transfer_async(job, (src, dst)):
            return False
        results = []
        deadline = time.monotonic() + 30
        while not results and time.monotonic() < deadline:  # the worker polls each step
            results = [r for r in handler.get_finished() if r.job_id == job]
            time.sleep(0.001)
        return bool(results) and results[0].success

    def store(self, hashes, gpu_blocks, fail=False):
        """prepare_store, the worker's transfer, complete_store (fail: the
        transfer is reported failed). Returns (hashes stored, success)."""
        out = self.manager.prepare_store(hashes)
        if out is None:
            return [], False
        todo = list(out.block_hashes_to_store)
        index = {bytes(h): i for i, h in enumerate(hashes)}
        src = kvshare.vllm.GPULoadStoreSpec([gpu_blocks[index[h]] for h in todo])
        ok = self._run(self.store_handler, src, out.store_spec) if todo else True
        self.manager.complete_store(hashes, success=ok and not fail)
        return todo, ok and not fail

    def lookup(self, hashes, repeat=2):
        """lookup() as the scheduler calls it: again at each step, the same answer."""
        hits = [self.manager.lookup(hashes) for _ in range(repeat)]
        self.lookups += repeat
        if len(set(hits)) != 1:
            raise Failure("repeated lookups disagree: %r" % hits)
        return hits[0]

    def load(self, hashes, gpu_blocks):
        """prepare_load, the worker's transfer, complete_load of the leading
        hits; returns (hits, success)."""
        hits = self.lookup(hashes)
        if hits == 0:
            return 0, True
        spec = self.manager.prepare_load(hashes[:hits])
        ok = self._run(self.load_handler, spec,
                       kvshare.vllm.GPULoadStoreSpec(gpu_blocks[:hits]))
        self.manager.complete_load(hashes[:hits])
        return hits, ok

    def close(self):
        self.store_handler.shutdown()
        self.load_handler.shutdown()


# -- SGLang --------------------------------------------------------------------

class SglangInstance:
    """One SGLang engine's host pool (layer_first: (2, layers, tokens,
    heads, dim)) with the kvshare storage backend, built as SGLang's backend
    factory builds it: cls(storage_config, extra config)."""

    def __init__(self, socket, ns="sglang.test", host_pages=16, head_dim=None):
        import torch
        self.torch = torch
        ps = GEO["block_tokens"]
        cfg = SimpleNamespace(tp_rank=0, tp_size=1, is_mla_model=False, model_name="test",
                              extra_config={"backend_name": "kvshare",
                                            "module_path": "kvshare.sglang",
                                            "class_name": "KvshareHiCacheStorage",
                                            "socket": socket, "namespace": ns,
                                            "timeout_ms": 2000})
        self.storage = kvshare.sglang.KvshareHiCacheStorage(cfg, cfg.extra_config)
        self.pool = SimpleNamespace(
            layer_num=GEO["layers"], head_num=GEO["kv_heads"],
            head_dim=head_dim or GEO["head_dim"], dtype=torch.float32, page_size=ps,
            layout="layer_first",
            kv_buffer=torch.zeros(2, GEO["layers"], host_pages * ps, GEO["kv_heads"],
                                  head_dim or GEO["head_dim"]))
        self.storage.register_mem_pool_host(self.pool)

    def indices(self, pages):
        ps = GEO["block_tokens"]
        return self.torch.tensor([p * ps + t for p in pages for t in range(ps)],
                                 dtype=self.torch.int64)

    def write_kv(self, pages, ks, vs):
        ps = GEO["block_tokens"]
        buf = self.pool.kv_buffer
        for layer in range(GEO["layers"]):
            for i, p in enumerate(pages):
                buf[0, layer, p * ps:(p + 1) * ps].copy_(ks[layer][i * ps:(i + 1) * ps])
                buf[1, layer, p * ps:(p + 1) * ps].copy_(vs[layer][i * ps:(i + 1) * ps])

    def read_kv(self, pages):
        idx = self.indices(pages)
        buf = self.pool.kv_buffer
        ks = [buf[0, layer, idx] for layer in range(GEO["layers"])]
        vs = [buf[1, layer, idx] for layer in range(GEO["layers"])]
        return ks, vs

    def store(self, keys, pages):
        return self.storage.batch_set_v1(keys, self.indices(pages))

    def load(self, keys, pages):
        """batch_exists, then batch_get_v1 of the leading pages found."""
        n = self.storage.batch_exists(keys)
        if n == 0:
            return 0, []
        return n, self.storage.batch_get_v1(keys[:n], self.indices(pages[:n]))
