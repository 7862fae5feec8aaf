# SPDX-License-Identifier: Apache-2.0
"""vLLM plug-in: an OffloadingSpec whose offloaded blocks live in kvshared.

vLLM's OffloadingConnector loads the spec by name (docs/ENGINES.md has the
exact --kv-transfer-config line):

    kv_connector_extra_config = {"spec_name": "KvshareOffloadingSpec",
                                 "spec_module_path": "kvshare.vllm",
                                 "socket": "/run/kvshare/kvshared.sock",
                                 "namespace": "vllm.llama-3.1-8b"}

Scheduler side, KvshareOffloadingManager keeps vLLM's block hashes as key
blocks of one namespace (kvshare.keyblocks) through the scheduler's own
session: lookup() counts leading cached hashes; prepare_load() pins them
until complete_load() (or until the session ends); prepare_store() allocates
WRITING blocks for the hashes not cached yet; complete_store() commits them
(or frees them on failure). Worker side, KvshareOffloadingHandler copies
between the engine's per-layer KV byte tensors and the pool blocks, in a
thread, and reports completions through get_finished().

The interface follows vLLM's v1 kv_offload source (abstract.py, spec.py,
mediums.py, worker/worker.py of the versions named in docs/ENGINES.md). When
vLLM is importable its base classes are used; otherwise this module defines
stand-ins with the same names, fields and methods, so that it can be tested
without vLLM.
"""
import collections
import queue
import threading
import time

import kvshare
from kvshare.keyblocks import EngineGeometry, GeometryMismatch, KeyBlocks, check_geometry
from kvshare.tensors import BlockCopier, pool_rows

try:  # pragma: no cover - only where vLLM is installed
    from vllm.v1.kv_offload.abstract import (LoadStoreSpec, OffloadingEvent, OffloadingManager,
                                             PrepareStoreOutput)
    from vllm.v1.kv_offload.mediums import GPULoadStoreSpec
    from vllm.v1.kv_offload.spec import OffloadingSpec
    from vllm.v1.kv_offload.worker.worker import OffloadingHandler, TransferResult
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class LoadStoreSpec:
        """Stand-in for vllm.v1.kv_offload.abstract.LoadStoreSpec."""

        @staticmethod
        def medium():
            raise NotImplementedError

    class PrepareStoreOutput:
        def __init__(self, block_hashes_to_store, store_spec, block_hashes_evicted):
            self.block_hashes_to_store = block_hashes_to_store
            self.store_spec = store_spec
            self.block_hashes_evicted = block_hashes_evicted

    class OffloadingEvent:
        def __init__(self, block_hashes, block_size, medium, removed):
            self.block_hashes = block_hashes
            self.block_size = block_size
            self.medium = medium
            self.removed = removed

    class OffloadingManager:
        """Stand-in for vllm.v1.kv_offload.abstract.OffloadingManager."""

    class GPULoadStoreSpec(LoadStoreSpec):
        """Stand-in for vllm.v1.kv_offload.mediums.GPULoadStoreSpec."""

        def __init__(self, block_ids, group_sizes=None, block_indices=None):
            self.block_ids = list(block_ids)
            self.group_sizes = group_sizes if group_sizes is not None else (len(self.block_ids),)
            self.block_indices = block_indices

        @staticmethod
        def medium():
            return "GPU"

    class OffloadingHandler:
        """Stand-in for vllm.v1.kv_offload.worker.worker.OffloadingHandler."""

        def shutdown(self):
            pass

    class TransferResult:
        def __init__(self, job_id, success, transfer_size=None, transfer_time=None,
                     transfer_type=None):
            self.job_id = job_id
            self.success = success
            self.transfer_size = transfer_size
            self.transfer_time = transfer_time
            self.transfer_type = transfer_type

    class OffloadingSpec:
        """Stand-in for vllm.v1.kv_offload.spec.OffloadingSpec (the fields
        this plug-in reads)."""

        def __init__(self, vllm_config, kv_cache_config):
            self.vllm_config = vllm_config
            self.kv_cache_config = kv_cache_config
            self.extra_config = vllm_config.kv_transfer_config.kv_connector_extra_config
            self.gpu_block_size = tuple(g.kv_cache_spec.block_size
                                        for g in kv_cache_config.kv_cache_groups)
            self.offloaded_block_size = int(self.extra_config.get("block_size",
                                                                  self.gpu_block_size[0]))
            self.block_size_factors = tuple(self.offloaded_block_size // b
                                            for b in self.gpu_block_size)

MEDIUM = "KVSHARE"
WHO = "kvshare.vllm"


class KvshareLoadStoreSpec(LoadStoreSpec):
    """Pool block ids, one per offloaded block; -1 marks a block that could
    not be pinned (evicted since lookup): loading it fails."""

    def __init__(self, block_ids):
        self.block_ids = [int(b) for b in block_ids]

    @staticmethod
    def medium():
        return MEDIUM

    def __repr__(self):
        return "KvshareLoadStoreSpec(%r)" % (self.block_ids,)


def _hashes(block_hashes):
    return [bytes(h) for h in block_hashes]


class KvshareOffloadingManager(OffloadingManager):
    """The scheduler side: vLLM's block hashes as key blocks of namespace ns.

    Pins and WRITING blocks belong to this manager's session. prepare_load
    takes one pin per hash, complete_load drops one (so requests loading the
    same hash each hold their own); a request the scheduler aborts without
    complete_load keeps its pins until the scheduler process exits."""

    def __init__(self, client, ns, geometry):
        self.keys = KeyBlocks(client, ns, engine=geometry, who=WHO)
        self.block_size = geometry.block_tokens
        self._loading = collections.defaultdict(list)  # hash -> pinned ids (a stack)
        self._storing = {}  # hash -> WRITING block id
        self._events = []

    # -- lookups and loads --
    def lookup(self, block_hashes):
        return self.keys.present_run(_hashes(block_hashes))

    def prepare_load(self, block_hashes):
        hashes = _hashes(block_hashes)
        ids = self.keys.pin(hashes)
        for h, b in zip(hashes, ids):
            if b is not None:
                self._loading[h].append(b)
        return KvshareLoadStoreSpec([-1 if b is None else b for b in ids])

    def touch(self, block_hashes):
        # A pool-side recency bump needs a Lookup per hash; lookup() and
        # prepare_load() already mark what they find as used.
        return None

    def complete_load(self, block_hashes):
        done = []
        for h in _hashes(block_hashes):
            pins = self._loading.get(h)
            if pins:
                done.append(pins.pop())
                if not pins:
                    del self._loading[h]
        self.keys.release(done)

    # -- stores --
    def prepare_store(self, block_hashes):
        hashes = _hashes(block_hashes)
        todo = [h for h in hashes if h not in self._storing and self.keys.find(h) is None]
        try:
            ids, evicted = self.keys.alloc_evicting(len(todo))
        except kvshare.KvsError:
            return None  # pool full of pinned blocks, or no daemon: vLLM skips the store
        for h, b in zip(todo, ids):
            self._storing[h] = b
        # The daemon names the blocks of this namespace that this Alloc
        # evicted (their keys); evictions made by other instances' requests
        # are not seen here (their lookups then miss).
        return PrepareStoreOutput(block_hashes_to_store=todo,
                                  store_spec=KvshareLoadStoreSpec(ids),
                                  block_hashes_evicted=evicted)

    def complete_store(self, block_hashes, success=True):
        stored, drop = [], []
        for h in _hashes(block_hashes):
            b = self._storing.pop(h, None)
            if b is None:
                continue
            if not success:
                drop.append(b)
                continue
            try:
                canonical = self.keys.commit(h, b)
            except kvshare.KvsError:
                drop.append(b)
                continue
            drop.append(canonical)  # the commit's pin: the block stays cached, unpinned
            if canonical != b:
                drop.append(b)  # another instance stored it first; ours is a duplicate
            else:
                stored.append(h)
        self.keys.release(drop)
        if stored:
            self._events.append(OffloadingEvent(block_hashes=stored, block_size=self.block_size,
                                                medium=MEDIUM, removed=False))

    def take_events(self):
        events, self._events = self._events, []
        yield from events


class KvshareOffloadingHandler(OffloadingHandler):
    """The worker side, one per direction: copies between the engine's KV
    tensors and pool blocks in a background thread (PyTorch copies release
    the GIL); transfer_async queues a job, get_finished returns the results
    of jobs done since the last call, wait blocks until the given jobs are."""

    def __init__(self, link, load):
        self.link = link
        self.load = load
        self._jobs = queue.Queue()
        self._done = []
        self._pending = set()
        self.last_error = None  # why the last failed job failed
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="kvshare-copy", daemon=True)
        self._thread.start()

    def transfer_async(self, job_id, spec):
        src, dst = spec
        with self._cond:
            self._pending.add(job_id)
        self._jobs.put((job_id, src, dst))
        return True

    def _copy(self, src, dst):
        copier = self.link.copier()
        if self.load:
            pool, gpu = src.block_ids, [int(b) for b in dst.block_ids]
            if any(b < 0 for b in pool):
                raise LookupError("a block was evicted before it was pinned")
            skip = 0
            if getattr(dst, "block_indices", None) is not None:
                skip = int(dst.block_indices[0]) % copier.factor
            copier.load(pool, gpu, skip=skip)
        else:
            copier.store([int(b) for b in src.block_ids], dst.block_ids)
        self.link.synchronize()
        return len(dst.block_ids if self.load else src.block_ids) * copier.bytes_per_block \
            // copier.factor

    def _run(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job_id, src, dst = job
            t0 = time.monotonic()
            try:
                size, ok = self._copy(src, dst), True
            except Exception as e:  # reported to vLLM as a failed transfer
                size, ok, self.last_error = 0, False, e
            result = TransferResult(job_id=job_id, success=ok, transfer_size=size,
                                    transfer_time=time.monotonic() - t0,
                                    transfer_type=(MEDIUM, "GPU") if self.load
                                    else ("GPU", MEDIUM))
            with self._cond:
                self._pending.discard(job_id)
                self._done.append(result)
                self._cond.notify_all()

    def get_finished(self):
        with self._cond:
            done, self._done = self._done, []
        return done

    def wait(self, job_ids):
        with self._cond:
            while self._pending & set(job_ids):
                self._cond.wait()

    def shutdown(self):
        self._jobs.put(None)
        self._thread.join()


def engine_geometry(kv_cache_config, offloaded_block_size):
    """The engine's layout from vLLM's KVCacheConfig: one KV cache group of
    attention layers (kv_cache_spec: block_size, num_kv_heads, head_size,
    dtype); raises GeometryMismatch for hybrid models (several groups)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise GeometryMismatch("%s: %d KV cache groups (a hybrid model); kvshared holds one "
                               "uniform layout" % (WHO, len(groups)))
    spec = groups[0].kv_cache_spec
    return EngineGeometry(len(groups[0].layer_names), spec.num_kv_heads, spec.head_size,
                          spec.dtype, offloaded_block_size)


def slot_tensors(torch, tensors, geo, factor):
    """Splits vLLM's canonical KV tensors (each (num_blocks, page_bytes)
    uint8/int8, pages of one or more layers' K and V slots in [layer][k|v]
    order: one tensor per layer with K then V in its page, or one per K and
    per V, or one for all layers) into layers x 2 engine rows tensors of
    (num_blocks, slot_bytes / factor), in [layer][k|v] order. Raises
    GeometryMismatch when the pages do not add up to the pool's slots."""
    slot = geo.slot_bytes // factor
    rows = []
    for t in tensors:
        t = t.view(torch.uint8) if t.dtype != torch.uint8 else t
        page = t.shape[1]
        if page % slot:
            raise GeometryMismatch("%s: a KV page of %d bytes is not a whole number of %d-byte "
                                   "K or V slots (%s)" % (WHO, page, slot, geo.describe()))
        for j in range(page // slot):
            rows.append(t[:, j * slot:(j + 1) * slot])
    if len(rows) != 2 * geo.layers:
        raise GeometryMismatch("%s: the engine's KV tensors hold %d K/V slots per block, the "
                               "pool %d (%s)" % (WHO, len(rows), 2 * geo.layers, geo.describe()))
    return rows


class _PoolLink:
    """A worker's mapping of the pool and the copier over it, made at the
    first transfer and again after the daemon restarts (a new mapping)."""

    def __init__(self, spec, tensors):
        self.spec = spec
        self.tensors = tensors
        self.client = None
        self._copier = None
        self._epoch = None
        self._lock = threading.Lock()
        self.device = tensors[0].device

    def copier(self):
        import torch
        with self._lock:
            if self.client is None:
                self.client = self.spec._connect(True, "vllm-worker")
            c = self.client
            if not c.connected:
                c.ping()  # reconnects or raises KvsError: the job fails
            if self._copier is None or c.epoch != self._epoch:
                check_geometry(c.geometry, self.spec.geometry, WHO)
                rows = slot_tensors(torch, self.tensors, self.spec.geometry, self.spec.factor)
                pool = [pool_rows(torch, c, layer, kv, self.device)
                        for layer in range(self.spec.geometry.layers) for kv in (0, 1)]
                self._copier = BlockCopier(list(zip(rows, pool)), factor=self.spec.factor)
                self._epoch = c.epoch
            return self._copier

    def synchronize(self):
        if self.device.type == "cuda":
            import torch
            torch.cuda.current_stream(self.device).synchronize()


class KvshareOffloadingSpec(OffloadingSpec):
    """vLLM loads this class by name (spec_name, spec_module_path). Extra
    config keys: socket (default: libkvshare's default path), namespace
    (default "vllm"; one per model and tenant), timeout_ms (default 1000),
    block_size (offloaded block size in tokens: vLLM's own key; must equal
    the pool's block_tokens)."""

    def __init__(self, vllm_config, kv_cache_config):
        super().__init__(vllm_config, kv_cache_config)
        cfg = self.extra_config
        self.socket = cfg.get("socket")
        self.ns = cfg.get("namespace", "vllm")
        self.timeout_ms = int(cfg.get("timeout_ms", 1000))
        if len(set(self.block_size_factors)) != 1:
            raise ValueError("%s: one block size factor expected, got %r"
                             % (WHO, self.block_size_factors))
        self.factor = self.block_size_factors[0]
        self.geometry = engine_geometry(kv_cache_config, self.offloaded_block_size)

    def _connect(self, map_pool, name):
        # Lazy: a daemon that is down makes every lookup a miss, never an error.
        client = kvshare.Client(socket_path=self.socket, timeout_ms=self.timeout_ms,
                                worker_name=name, map_pool=map_pool, lazy=True)
        if client.connected:
            check_geometry(client.geometry, self.geometry, WHO)
        return client

    def get_manager(self):
        """Raises GeometryMismatch when the daemon's pool has another layout."""
        return KvshareOffloadingManager(self._connect(False, "vllm-scheduler"), self.ns,
                                        self.geometry)

    def get_handlers(self, kv_caches, attn_backends=None):
        """kv_caches: vLLM's CanonicalKVCaches (or a list of its tensors).
        Raises GeometryMismatch when the tensors' pages or the daemon's pool
        do not match the engine's layout."""
        import torch
        tensors = [getattr(t, "tensor", t) for t in getattr(kv_caches, "tensors", kv_caches)]
        slot_tensors(torch, tensors, self.geometry, self.factor)  # refuses a wrong layout now
        link = _PoolLink(self, tensors)
        try:
            link.copier()  # maps the pool and checks its layout now, not at the first transfer
        except kvshare.KvsError:
            pass  # no daemon yet: the scheduler sees misses, transfers wait for it
        self.link = link
        yield GPULoadStoreSpec, KvshareLoadStoreSpec, KvshareOffloadingHandler(link, False)
        yield KvshareLoadStoreSpec, GPULoadStoreSpec, KvshareOffloadingHandler(link, True)
