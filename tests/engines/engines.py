# SPDX-License-Identifier: Apache-2.0
"""What the engine plug-in tests and tools share: engine instances that make
vLLM's and SGLang's calls in the engines' order, with the engines' own
interface modules (mirrors in tests/engines/upstream/, on sys.path under the
engines' module names), their keys, their KV tensors, and the reference model
of the PyTorch check (tests/client/torch_share.py).

These are harnesses, not the engines: neither engine is installed here.
KVS_VLLM_LAYOUT picks vLLM's interface: "newest" (vllm/v1/kv_offload/base.py
with OffloadingWorker; default), "base" (the base-era releases, v0.21 to
v0.25: base.py with get_handlers and a single-key lookup answering a bool,
the handler in worker/worker.py) or "abstract" (abstract/spec/mediums/worker
of the older releases). The call orders they follow:

  vLLM, newest (distributed/kv_transfer/kv_connector/v1/offloading/
  scheduler.py and worker.py): the spec from OffloadingSpecFactory.create_spec
  (issubclass check, spec_cls(config)); get_manager() in the scheduler,
  get_worker(CanonicalKVCaches) in the worker. Scheduler: on_new_request,
  lookup(key, ctx) per key until the first non-HIT (again at every step),
  prepare_load(hit keys, ctx); worker: assert submit_load(job, spec, GPU
  spec); get_finished() each step, asserting every result's success;
  scheduler: complete_load(keys, ctx) once the job is done. Stores:
  prepare_store(keys, ctx) -> PrepareStoreOutput; worker: assert
  submit_store(job, GPU spec, store spec); complete_store(keys, ctx) once the
  job is done; on_request_finished(ctx) at the end.
  vLLM, base era: as the newest without on_new_request and
  on_request_finished (lookup pins expire), lookup answering True/False,
  and the handlers of get_handlers(CanonicalKVCaches) as below.
  vLLM, abstract era: lookup(block_hashes) -> int, prepare_load(hashes),
  handler.transfer_async(job, (src, dst)), get_finished() -> [(job, ok)],
  complete_load(hashes); prepare_store(hashes), transfer_async,
  complete_store(hashes) (on preemption, before the copy has finished).
  SGLang (managers/cache_controller.py): the backend from
  StorageBackendFactory.create_backend("dynamic", ...); prefetch:
  batch_exists(keys) -> n, then with "interface_v1" batch_get_v1(keys[:n],
  host_indices), without it batch_get(keys, flat pages) and
  set_from_flat_data_page; backup: batch_set_v1, or batch_set(keys, flat
  pages); with storage metrics on, log_storage_metrics(get_stats()).
"""
import dataclasses
import hashlib
import itertools
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
import weakref
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUT = os.environ.get("KVS_VLLM_LAYOUT", "newest")
# The manager's calls take a request context (newest, base) or not (abstract).
KEYED = LAYOUT != "abstract"
# vLLM instances share blocks only with one fixed hash seed (docs/ENGINES.md):
# the harness runs as an operator must configure them (kvshare.vllm refuses
# to start otherwise; case identity checks that refusal). Inherited by the
# instances the tests run in other processes.
os.environ.setdefault("PYTHONHASHSEED", "0")
UPSTREAM = os.path.join(HERE, "upstream")
sys.path.insert(0, os.path.join(UPSTREAM, "sglang"))
sys.path.insert(0, os.path.join(UPSTREAM, "vllm_" + LAYOUT))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "client"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import kvsd  # noqa: E402
import kvshare  # noqa: E402
import kvshare.sglang  # noqa: E402
import kvshare.vllm  # noqa: E402
import torch_share  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as sg_storage  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402
from sglang.srt.observability.metrics_collector import StorageMetricsCollector  # noqa: E402
if LAYOUT == "newest":
    from vllm.v1.kv_offload import base as vbase  # noqa: E402
    from vllm.v1.kv_offload import config as vconfig  # noqa: E402
elif KEYED:
    from vllm.v1.kv_offload import base as vbase  # noqa: E402
else:
    from vllm.v1.kv_offload import mediums as vmediums  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
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

_ENGINES = itertools.count()
# The releases name no request: their lookup pins last until prepare_load
# or this long (lookup_pin_ttl_s), and finish() waits it out.
RELEASE_PIN_TTL_S = 0.2


def vllm_key(block_hash):
    """The key vLLM's manager is given for a block hash of KV cache group 0:
    an OffloadKey (hash + group index) in the newest layout, the hash in
    the releases."""
    return vbase.make_offload_key(block_hash, 0) if KEYED else block_hash


def vllm_configs(socket, ns, state_file, head_dim=None, block_size=None, layers=None,
                 world_size=1, rank=0, kv_heads=None, model="test", revision=None,
                 hash_algo="sha256_cbor", events=True, timeout_ms=2000, extra_keys=None):
    """What vLLM hands the spec: an OffloadingConfig (newest), or the parts
    of VllmConfig and KVCacheConfig the releases' spec reads. ns None: no
    namespace configured (the plug-in derives one from the model);
    revision: the model's revision (the releases' ModelConfig.revision, the
    extra config's model_revision in the newest layout, whose
    OffloadingConfig names none); hash_algo: the releases'
    prefix_caching_hash_algo; events: vLLM's KV events on (vLLM's default
    is off); extra_keys: more extra-config keys."""
    import torch
    extra = {"spec_name": "KvshareOffloadingSpec", "spec_module_path": "kvshare.vllm",
             "socket": socket, "timeout_ms": timeout_ms, "state_file": state_file}
    extra.update(extra_keys or {})
    if ns is not None:
        extra["namespace"] = ns
    if revision is not None and LAYOUT == "newest":
        extra["model_revision"] = revision
    bt = block_size or GEO["block_tokens"]
    nl = layers or GEO["layers"]
    names = tuple("model.layers.%d.self_attn" % i for i in range(nl))
    engine_id = "engine-%d-%d" % (os.getpid(), next(_ENGINES))
    if LAYOUT != "newest":
        extra["lookup_pin_ttl_s"] = RELEASE_PIN_TTL_S
    if LAYOUT == "newest":
        page = bt * (kv_heads or GEO["kv_heads"]) * (head_dim or GEO["head_dim"]) * 4
        return vconfig.OffloadingConfig(
            groups=(vconfig.OffloadingGroupConfig(tokens_per_block=bt, layer_names=names),),
            worker_kv_bytes_per_block=2 * nl * page, enable_kv_cache_events=events,
            extra_config=extra, engine_id=engine_id,
            model=vconfig.OffloadingModelConfig(name=model, dtype="float32"),
            cache=vconfig.OffloadingCacheConfig(tokens_per_hash=bt, blocks_per_chunk=1),
            parallel=vconfig.OffloadingParallelConfig(
                rank=rank, world_size=world_size, tp_size=world_size, pp_size=1, pcp_size=1,
                dcp_size=1, data_parallel_index=0, is_parallelism_agnostic=False))
    vcfg = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config=extra, engine_id=engine_id),
        cache_config=SimpleNamespace(block_size=bt, cache_dtype="auto",
                                     prefix_caching_hash_algo=hash_algo),
        model_config=SimpleNamespace(model=model, revision=revision, tokenizer_revision=None,
                                     dtype=torch.float32),
        parallel_config=SimpleNamespace(world_size=world_size, tensor_parallel_size=world_size),
        kv_events_config=SimpleNamespace(enable_kv_cache_events=events))
    spec = SimpleNamespace(block_size=bt, num_kv_heads=GEO["kv_heads"],
                           head_size=head_dim or GEO["head_dim"], dtype=torch.float32)
    kcfg = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=list(names),
                                                            kv_cache_spec=spec)])
    return vcfg, kcfg


def create_spec(socket, ns, state_file, **geo):
    """The spec as vLLM's factory makes it (the issubclass check, then the
    constructor of the layout)."""
    cfg = vllm_configs(socket, ns, state_file, **geo)
    if LAYOUT == "newest":
        return OffloadingSpecFactory.create_spec(cfg)
    return OffloadingSpecFactory.create_spec(*cfg)


def gpu_spec(blocks, first_index=0):
    """vLLM's GPULoadStoreSpec of one KV cache group."""
    if KEYED:
        return vbase.GPULoadStoreSpec(list(blocks), group_sizes=(len(blocks),),
                                      block_indices=(first_index,))
    return vmediums.GPULoadStoreSpec(list(blocks))


class VllmInstance:
    """One vLLM engine with the kvshare offloading spec: the scheduler-side
    manager and the worker over its own paged KV cache, laid out as
    FlashAttention's (2, num_blocks, block_size, kv_heads, head_dim) per
    layer and handed over split into K and V canonical tensors (num_blocks,
    page bytes), or, with joined=True, as FlashInfer's (num_blocks, 2, ...)
    with K and V in one page. The methods make the connector's calls in its
    order and check what it checks (every transfer succeeded)."""

    def __init__(self, socket, ns="vllm.test", gpu_blocks=16, joined=False, **geo):
        """ns None: the namespace the plug-in derives from the model; geo:
        vllm_configs' keywords (geometry, model, revision, hash_algo)."""
        import torch
        self.torch = torch
        self.state_dir = tempfile.mkdtemp(prefix="kvs-vllm-")
        # Removed by close(), or when the instance goes or the process exits.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.state_dir, True)
        self.spec = create_spec(socket, ns, os.path.join(self.state_dir, "pools"), **geo)
        self.manager = self.spec.get_manager()
        bt, h, d = GEO["block_tokens"], GEO["kv_heads"], GEO["head_dim"]
        layers = geo.get("layers") or GEO["layers"]
        geo.pop("world_size", None)
        self.kv = []
        canonical = []
        for _ in range(layers):
            if joined:
                t = torch.zeros(gpu_blocks, 2, bt, h, d)
                canonical.append(t.view(gpu_blocks, -1).view(torch.int8))
                self.kv.append(t.transpose(0, 1))
            else:
                t = torch.zeros(2, gpu_blocks, bt, h, d)
                canonical += [t[0].reshape(gpu_blocks, -1).view(torch.int8),
                              t[1].reshape(gpu_blocks, -1).view(torch.int8)]
                self.kv.append(t)
        if KEYED:
            tensors = [vbase.CanonicalKVCacheTensor(tensor=c, page_size_bytes=c.shape[1])
                       for c in canonical]
            refs = [vbase.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=c.shape[1])
                    for i, c in enumerate(canonical)]
            caches = vbase.CanonicalKVCaches(tensors=tensors, group_data_refs=[refs])
        if LAYOUT == "newest":
            self.worker = self.spec.get_worker(caches)
            self.core = self.worker.core
        else:
            handlers = {}
            got = (self.spec.get_handlers(caches) if LAYOUT == "base" else
                   self.spec.get_handlers({"layer%d" % i: c for i, c in enumerate(canonical)},
                                          {}))
            for src, dst, handler in got:
                handlers[(src.medium(), dst.medium())] = handler
            self.store_handler = handlers[("GPU", "KVSHARE")]
            self.load_handler = handlers[("KVSHARE", "GPU")]
            self.core = self.load_handler.core
        self.job = 0
        self.lookups = 0
        self._contexts = {}

    # -- the request context (newest and base layouts) --
    def ctx(self, req):
        if req not in self._contexts:
            self._contexts[req] = vbase.ReqContext(req_id=req) if KEYED else None
            if LAYOUT == "newest":
                self.manager.on_new_request(self._contexts[req])
        return self._contexts[req]

    def finish(self, req):
        """The request ends (on_request_finished in the newest layout)."""
        c = self._contexts.pop(req, None)
        if LAYOUT == "newest" and c is not None:
            self.manager.on_request_finished(c)
        if LAYOUT != "newest":
            # No call ends a request: its lookup pins expire, dropped at the
            # manager's next lookup or prepare_store (made here, of nothing).
            time.sleep(RELEASE_PIN_TTL_S * 1.5)
            if KEYED:
                self.manager.prepare_store([], vbase.ReqContext(req_id="-"))
            else:
                self.manager.lookup([])

    # -- KV contents --
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

    # -- the worker side --
    def submit(self, load, src, dst):
        """Submits a job as the connector's worker does (asserting the
        submission); returns its id."""
        self.job += 1
        if LAYOUT == "newest":
            ok = (self.worker.submit_load if load else self.worker.submit_store)(
                self.job, src, dst)
        else:
            ok = (self.load_handler if load else self.store_handler).transfer_async(
                self.job, (src, dst))
        assert ok, "vLLM asserts that a transfer is submitted"
        return self.job

    def finished(self):
        """get_finished() as the connector's worker calls it each step,
        asserting (as vLLM does) that every transfer succeeded."""
        if LAYOUT == "newest":
            results = [(r.job_id, r.success) for r in self.worker.get_finished()]
        else:
            results = [tuple(r) if isinstance(r, tuple) else (r.job_id, r.success)
                       for h in (self.store_handler, self.load_handler)
                       for r in h.get_finished()]
        for job, ok in results:
            assert ok, "vLLM asserts transfer_result.success (job %d failed: %s)" % (
                job, self.core.last_error)
        return [job for job, _ in results]

    def wait_job(self, job, seconds=30):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if job in self.finished():
                return
            time.sleep(0.001)
        raise Failure("job %d did not finish" % job)

    # -- the scheduler side --
    def lookup(self, hashes, req="r", repeat=2):
        """get_num_new_matched_tokens: leading blocks found, asked again at
        each step (the same answer)."""
        hits = []
        for _ in range(repeat):
            if KEYED:
                hit = vbase.LookupResult.HIT if LAYOUT == "newest" else True
                n = 0
                for h in hashes:
                    if self.manager.lookup(vllm_key(h), self.ctx(req)) != hit:
                        break
                    n += 1
                hits.append(n)
            else:
                hits.append(self.manager.lookup([vllm_key(h) for h in hashes]))
        self.lookups += repeat
        # A hit is pinned: asked again, it must hold. A later ask may find
        # more (a store finished, or the daemon came back between the asks
        # and the breaker let the second through), never fewer.
        if any(later < earlier for earlier, later in zip(hits, hits[1:])):
            raise Failure("a repeated lookup found fewer blocks: %r" % hits)
        return hits[-1]

    def prepare_load(self, hashes, req="r"):
        keys = [vllm_key(h) for h in hashes]
        if KEYED:
            return self.manager.prepare_load(keys, self.ctx(req))
        return self.manager.prepare_load(keys)

    def complete_load(self, hashes, req="r"):
        keys = [vllm_key(h) for h in hashes]
        if KEYED:
            self.manager.complete_load(keys, self.ctx(req))
        else:
            self.manager.complete_load(keys)

    def load(self, hashes, gpu_blocks, req="r", between=None):
        """lookup, prepare_load, the worker's transfer, complete_load of the
        leading hits (between(): called after the lookup, before the
        load); returns the number of blocks loaded."""
        hits = self.lookup(hashes, req)
        if between is not None:
            between()
        if hits == 0:
            self.finish(req)
            return 0
        spec = self.prepare_load(hashes[:hits], req)
        self.wait_job(self.submit(True, spec, gpu_spec(gpu_blocks[:hits])))
        self.complete_load(hashes[:hits], req)
        self.finish(req)
        return hits

    def prepare_store(self, hashes, req="r"):
        keys = [vllm_key(h) for h in hashes]
        if KEYED:
            return self.manager.prepare_store(keys, self.ctx(req))
        return self.manager.prepare_store(keys)

    def todo(self, out):
        return list(out.keys_to_store if KEYED else out.block_hashes_to_store)

    def complete_store(self, keys, req="r", success=True):
        if KEYED:
            self.manager.complete_store(keys, self.ctx(req), success=success)
        else:
            self.manager.complete_store(keys, success=success)

    def store(self, hashes, gpu_blocks, req="r", early=False):
        """prepare_store, the worker's transfer, complete_store (early: before
        the transfer has finished, as the releases' scheduler does on
        preemption). Returns the keys prepare_store asked for, or None when
        it declined."""
        out = self.prepare_store(hashes, req)
        if out is None:
            return None
        todo = self.todo(out)
        index = {vllm_key(h): i for i, h in enumerate(hashes)}
        if todo:
            job = self.submit(False, gpu_spec([gpu_blocks[index[k]] for k in todo]),
                              out.store_spec)
            if early:
                self.complete_store(todo, req)
            self.wait_job(job)
        if not early or not todo:
            self.complete_store(todo, req)
        self.finish(req)
        return todo

    def events(self):
        """take_events(): the keys of each stored event."""
        out = []
        for e in self.manager.take_events():
            out.append(list(e.keys if KEYED else e.block_hashes))
        return out

    def close(self):
        if LAYOUT == "newest":
            self.worker.shutdown()
        else:
            self.store_handler.shutdown()
            self.load_handler.shutdown()
        self.manager.core.close()
        self._cleanup()


# -- SGLang --------------------------------------------------------------------

class VllmGroup(VllmInstance):
    """One vLLM engine with tensor parallelism over tp workers (in this
    process): the scheduler's manager, from the spec vLLM builds in the
    scheduler process, and one worker per rank, each from its own spec
    (OffloadingConfig.parallel.rank = r) over its own paged KV cache of
    kv_heads / tp heads (FlashAttention's layout, K and V split). A job goes
    to every worker and is done when every worker reported it, as vLLM's
    connector aggregates the workers' finished transfers before it calls
    complete_load or complete_store. Needs a kvshared --devices 0-(tp-1)
    with one rank's geometry (daemon_tp)."""

    def __init__(self, socket, tp, ns="vllm.tp", gpu_blocks=16):
        import torch
        self.torch = torch
        self.tp = tp
        self.heads = GEO["kv_heads"] // tp
        self.state_dir = tempfile.mkdtemp(prefix="kvs-vllm-tp-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.state_dir, True)
        state = os.path.join(self.state_dir, "pools")
        cfgs = [vllm_configs(socket, ns, state, world_size=tp, rank=r, kv_heads=self.heads)
                for r in range(tp)]
        # One engine: every process of it has the same engine id.
        cfgs = [dataclasses.replace(c, engine_id=cfgs[0].engine_id) for c in cfgs]
        self.specs = [OffloadingSpecFactory.create_spec(c) for c in cfgs]
        self.spec = self.specs[0]
        self.manager = self.spec.get_manager()
        bt, d = GEO["block_tokens"], GEO["head_dim"]
        self.kvs, caches = [], []
        for spec in self.specs:
            kv, canonical = [], []
            for _ in range(GEO["layers"]):
                t = torch.zeros(2, gpu_blocks, bt, self.heads, d)
                canonical += [t[0].reshape(gpu_blocks, -1).view(torch.int8),
                              t[1].reshape(gpu_blocks, -1).view(torch.int8)]
                kv.append(t)
            tensors = [vbase.CanonicalKVCacheTensor(tensor=c, page_size_bytes=c.shape[1])
                       for c in canonical]
            refs = [vbase.CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=c.shape[1])
                    for i, c in enumerate(canonical)]
            self.kvs.append(kv)
            caches.append(vbase.CanonicalKVCaches(tensors=tensors, group_data_refs=[refs]))
        # vLLM's workers are processes that start together: each waits for
        # the group's other ranks to show up on its node (check_one_node).
        self.workers = [None] * tp
        errors = []

        def start(r):
            try:
                self.workers[r] = self.specs[r].get_worker(caches[r])
            except Exception as e:  # noqa: BLE001 - raised below, in the caller
                errors.append(e)
        threads = [threading.Thread(target=start, args=(r,)) for r in range(tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        self.worker = self.workers[0]
        self.core = self.worker.core
        self.job = 0
        self.lookups = 0
        self._contexts = {}
        self._done = [set() for _ in range(tp)]

    def write_kv(self, blocks, ks, vs):
        """A prompt's per-layer K and V ([T, kv_heads, dim]): rank r gets
        heads [r * heads, (r + 1) * heads) in its own cache."""
        bt, h = GEO["block_tokens"], self.heads
        for r, kv in enumerate(self.kvs):
            for layer, t in enumerate(kv):
                for i, b in enumerate(blocks):
                    t[0, b].copy_(ks[layer][i * bt:(i + 1) * bt, r * h:(r + 1) * h])
                    t[1, b].copy_(vs[layer][i * bt:(i + 1) * bt, r * h:(r + 1) * h])

    def read_kv(self, blocks):
        """Per-layer K and V of the given blocks, every rank's heads side by
        side ([T, kv_heads, dim])."""
        ks, vs = [], []
        for layer in range(GEO["layers"]):
            ks.append(self.torch.cat([kv[layer][0, blocks].reshape(-1, self.heads,
                                                                   GEO["head_dim"])
                                      for kv in self.kvs], dim=1))
            vs.append(self.torch.cat([kv[layer][1, blocks].reshape(-1, self.heads,
                                                                   GEO["head_dim"])
                                      for kv in self.kvs], dim=1))
        return ks, vs

    def submit(self, load, src, dst):
        self.job += 1
        for w in self.workers:
            ok = (w.submit_load if load else w.submit_store)(self.job, src, dst)
            assert ok, "vLLM asserts that a transfer is submitted"
        return self.job

    def finished(self):
        """Jobs every worker has reported (each result asserted, as vLLM
        does)."""
        for r, w in enumerate(self.workers):
            for res in w.get_finished():
                assert res.success, "vLLM asserts transfer_result.success (rank %d job %d: %s)" % (
                    r, res.job_id, w.core.last_error)
                self._done[r].add(res.job_id)
        done = set.intersection(*self._done)
        for s in self._done:
            s.difference_update(done)
        return sorted(done)

    def close(self):
        for w in self.workers:
            w.shutdown()
        self.manager.core.close()
        self._cleanup()


def daemon_tp(kvshared, tp, extra=()):
    """A kvshared --devices 0-(tp-1) whose pools hold one rank's heads
    (GEO's kv_heads / tp)."""
    try:
        return kvsd.Daemon(blocks=POOL_BLOCKS, kvshared=kvshared,
                           geometry=dict(GEO, dtype="fp32", kv_heads=GEO["kv_heads"] // tp),
                           extra=("--devices", "0-%d" % (tp - 1)) + tuple(extra))
    except RuntimeError as e:
        raise Failure(str(e))


class HostPool:
    """SGLang's host KV pool in the layer_first layout (mem_cache/
    memory_pool_host.py, MHATokenToKVPoolHost): kv_buffer (2, layers,
    tokens, heads, head_dim), and the flat-page helpers the generic (not
    interface_v1) path uses: a page is kv_buffer[:, :, i:i + page_size]
    flattened."""

    def __init__(self, torch, pages, head_dim, heads=None):
        ps = GEO["block_tokens"]
        self.layer_num, self.head_num = GEO["layers"], heads or GEO["kv_heads"]
        self.head_dim, self.dtype, self.page_size = head_dim, torch.float32, ps
        self.layout = "layer_first"
        self.kv_buffer = torch.zeros(2, GEO["layers"], pages * ps, self.head_num, head_dim)

    def get_flat_data_page(self, index):
        return self.kv_buffer[:, :, index:index + self.page_size].flatten()

    def get_dummy_flat_data_page(self):
        return self.get_flat_data_page(0).clone().zero_()

    def set_from_flat_data_page(self, index, data_page):
        self.kv_buffer[:, :, index:index + self.page_size] = data_page.reshape(
            2, self.layer_num, self.page_size, self.head_num, self.head_dim)


class SglangInstance:
    """One SGLang engine's host pool with the kvshare storage backend, made
    by SGLang's backend factory ("dynamic") from a HiCacheStorageConfig;
    prefetch() and backup() call what HiCacheController calls, with or
    without interface_v1, and log the storage metrics when they are on."""

    def __init__(self, socket, ns="sglang.test", host_pages=16, head_dim=None,
                 interface_v1=True, metrics=False, tp_devices=False, model="test",
                 timeout_ms=2000, **ranks):
        """tp_devices: the TP ranks share one kvshared --devices (each rank's
        host pool holds its kv_heads / tp_size heads). ns None: the
        namespace the plug-in derives from the model (model_name)."""
        import torch
        self.torch = torch
        extra = {"backend_name": "kvshare", "module_path": "kvshare.sglang",
                 "class_name": "KvshareHiCacheStorage", "socket": socket,
                 "timeout_ms": timeout_ms}
        if ns is not None:
            extra["namespace"] = ns
        if interface_v1:
            extra["interface_v1"] = 1
        if tp_devices:
            extra["tp_devices"] = 1
        cfg = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                   is_mla_model=False, enable_storage_metrics=metrics,
                   is_page_first_layout=False, model_name=model, extra_config=extra)
        cfg.update(ranks)
        self.config = sg_storage.HiCacheStorageConfig(**cfg)
        heads = GEO["kv_heads"] // cfg["tp_size"] if tp_devices else None
        self.pool = HostPool(torch, host_pages, head_dim or GEO["head_dim"], heads)
        self.storage = StorageBackendFactory.create_backend("dynamic", self.config, self.pool)
        self.storage.register_mem_pool_host(self.pool)
        self.v1 = bool(extra.get("interface_v1"))
        self.collector = StorageMetricsCollector() if metrics else None

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

    def _metrics(self):
        if self.collector is not None:
            self.collector.log_storage_metrics(self.storage.get_stats())

    def store(self, keys, pages):
        """The controller's backup of pages: one bool per page."""
        if self.v1:
            ok = self.storage.batch_set_v1(keys, self.indices(pages))
        else:
            ps = GEO["block_tokens"]
            flat = [self.pool.get_flat_data_page(p * ps) for p in pages]
            ok = [bool(self.storage.batch_set(keys, flat))] * len(keys)
        self._metrics()
        return ok

    def load(self, keys, pages):
        """The controller's prefetch: batch_exists, then a get of the leading
        pages found; (n, one bool per page read)."""
        n = self.storage.batch_exists(keys)
        if n == 0:
            return 0, []
        if self.v1:
            ok = self.storage.batch_get_v1(keys[:n], self.indices(pages[:n]))
        else:
            ps = GEO["block_tokens"]
            got = self.storage.batch_get(keys[:n], [self.pool.get_dummy_flat_data_page()
                                                    for _ in range(n)])
            ok = []
            for p, page in zip(pages, got):
                ok.append(page is not None)
                if page is not None:
                    self.pool.set_from_flat_data_page(p * ps, page)
        self._metrics()
        return n, ok
