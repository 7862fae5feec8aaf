# SPDX-License-Identifier: Apache-2.0
"""SGLang plug-in: a HiCache storage backend (L3) whose pages live in kvshared.

SGLang loads it with the dynamic storage backend (docs/ENGINES.md has the
exact flags):

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvshare", "module_path": "kvshare.sglang",
      "class_name": "KvshareHiCacheStorage", "interface_v1": 1,
      "socket": "/run/kvshare/kvshared.sock"}'

("interface_v1": 1 makes SGLang call batch_get_v1/batch_set_v1, the
zero-copy path; without it SGLang calls the per-page batch_get/batch_set.)

SGLang names each page by a key chained through the previous page's key
(hex SHA-256, with no seed: equal in every process); this backend keeps
pages as key blocks (kvshare.keyblocks) of one namespace, one per model,
rank and tenant: without a configured "namespace" one derived from the
model identity ("sglang-SLUG-HASH": model_name, model_revision from the
extra config, the host pool's dtype and geometry), declared in Hello so
that kvshared refuses a namespace holding another model's KV (logged once,
then a cache that always misses). SGLang passes no tenant or cache salt to
storage, so tenants need a configured namespace each, and every rank that
holds different KV gets its own (rank_namespace: tensor, pipeline and
attention context-parallel ranks).
Pages are copied between SGLang's host KV pool (register_mem_pool_host) and
pool blocks; batch_exists counts leading pages present, batch_get_v1 and
batch_set_v1 move pages by host indices and say per page whether it worked.

Tensor parallelism on one kvshared for the group ("tp_devices": 1 in the
extra config; kvshared --devices 0-(tp_size-1) with one rank's heads): each
TP rank connects as its rank (it maps only its device's pool) and all ranks
share the namespace (pipeline and attention context-parallel ranks still
get their own: they hold other layers or tokens). SGLang's ranks store the
same pages without talking to each other, so a rank's Alloc declares the
page's key and the daemon gives each later rank the block an earlier rank
declared for it; each rank copies its heads there and commits its shard,
and the page is stored (found by batch_exists) once every rank has. A
block that waits for another rank is given back after PENDING_S.

The interface follows SGLang's python/sglang/srt/mem_cache/hicache_storage.py
and storage/backend_factory.py (versions in docs/ENGINES.md); the class
derives from SGLang's own HiCacheStorage, so this module does not import
without SGLang.
"""
import time

import kvshare
from kvshare.keyblocks import (EngineGeometry, Failures, GeometryMismatch, KeyBlocks,
                               check_geometry, client_options, declared_identity,
                               default_namespace, guarded, open_declared)
from kvshare.tensors import BlockCopier, pool_rows

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
except ImportError as e:
    raise ImportError("kvshare.sglang needs SGLang's HiCacheStorage "
                      "(sglang.srt.mem_cache.hicache_storage): %s" % e) from e

# SGLang's StorageMetrics moved: observability.metrics_collector (newest),
# metrics.collector (before). get_stats() returns None where neither imports.
StorageMetrics = None
for _where in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
    try:
        StorageMetrics = getattr(__import__(_where, fromlist=["StorageMetrics"]),
                                 "StorageMetrics")
        break
    except (ImportError, AttributeError):
        continue

WHO = "kvshare.sglang"
MAX_PAGES = 128  # SGLang asks for at most this many pages per call
# Tensor parallelism on one kvshared: a page block whose shard this rank
# committed but another rank's never came is given back after this long.
PENDING_S = 30.0


def page_key(key):
    """SGLang's page key (hex SHA-256, maybe with a "_..." rank suffix) as
    the 32 bytes of the digest."""
    digest = key.split("_", 1)[0] if isinstance(key, str) else key
    if isinstance(digest, str):
        try:
            return bytes.fromhex(digest)
        except ValueError:
            raise ValueError("%s: page key %r is not hex" % (WHO, key[:80]))
    return bytes(digest)


def rank_namespace(ns, storage_config, tp_devices=False):
    """ns with the ranks that hold different KV: "_tp{rank}_{size}" with
    tensor parallelism (not with tp_devices: one kvshared device per TP rank,
    one block for all of them), "_pp{rank}_{size}" with pipeline
    parallelism, "_cp{rank}_{size}" with attention context parallelism (as
    SGLang's own file backend names its files). Data-parallel ranks hold the
    same KV and share the namespace."""
    for tag, rank, size in (("tp", "tp_rank", "tp_size"), ("pp", "pp_rank", "pp_size"),
                            ("cp", "attn_cp_rank", "attn_cp_size")):
        n = int(getattr(storage_config, size, 1) or 1)
        if n > 1 and not (tag == "tp" and tp_devices):
            ns += "_%s%d_%d" % (tag, int(getattr(storage_config, rank, 0) or 0), n)
    return ns


def _option(storage_config, kwargs, name, default=None):
    """A setting from the extra config (SGLang passes it in storage_config
    and in kwargs, depending on its version), else default."""
    for source in (kwargs or {}, getattr(storage_config, "extra_config", None) or {}):
        if name in source:
            return source[name]
    return default


class KvshareHiCacheStorage(HiCacheStorage):
    """Constructed by SGLang as cls(storage_config, kwargs).

    No exception of kvshare's reaches SGLang's threads (its storage threads
    catch only queue.Empty: one exception would end HiCache's storage layer
    for the process): every entry point after register_mem_pool_host is
    guarded (keyblocks.guarded) and answers SGLang's own failure values
    (0 pages, False per page, None), counted by kind in stats()["failures"]
    and logged once per kind. The client has the circuit breaker: a hung
    daemon costs one timeout, then every call fails at once."""

    def __init__(self, storage_config=None, kwargs=None):
        self.failures = Failures(WHO)
        self.socket = _option(storage_config, kwargs, "socket")
        self.tp = int(getattr(storage_config, "tp_size", 1) or 1)
        self.tp_rank = None
        tp_devices = bool(int(_option(storage_config, kwargs, "tp_devices", 0) or 0))
        if tp_devices and self.tp > 1:
            self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.storage_config = storage_config
        # An explicit namespace wins; else one per model identity, derived
        # at register_mem_pool_host, where the host pool tells the dtype and
        # geometry (never one namespace for every model).
        self.model = getattr(storage_config, "model_name", None)
        self.revision = _option(storage_config, kwargs, "model_revision")
        self.explicit_ns = _option(storage_config, kwargs, "namespace")
        if not self.explicit_ns and not self.model:
            raise ValueError("%s: SGLang passed no model_name; set \"namespace\" in "
                             "--hicache-storage-backend-extra-config" % WHO)
        self.ns = None
        if self.explicit_ns:
            self.ns = self._rank_ns(self.explicit_ns)
        self.timeout_ms = int(_option(storage_config, kwargs, "timeout_ms", 1000))
        if getattr(storage_config, "is_mla_model", False):
            raise GeometryMismatch("%s: MLA models keep one latent vector per token; kvshared "
                                   "pools hold K and V" % WHO)
        # Connected at register_mem_pool_host, declaring the model identity.
        self.client = None
        self._pending = {}  # tp_devices: block -> when its shard waited for other ranks
        self.keys = None
        self.copier = None
        self._epoch = None
        self.mem_pool_host = None
        self.last_clear = None
        self.counts = {"exists": 0, "hits": 0, "gets": 0, "get_failures": 0, "sets": 0,
                       "set_present": 0, "set_failures": 0}
        # Kept only when SGLang reads them (get_stats), else they would grow.
        self.enable_metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._metrics = self._new_metrics()

    def _rank_ns(self, ns):
        ns = rank_namespace(ns, self.storage_config, self.tp_rank is not None)
        if len(ns.encode()) >= 64:
            raise ValueError("%s: namespace %r is too long (kvshared takes 63 bytes)" % (WHO, ns))
        return ns

    def _connect(self):
        """The client, declaring the model identity in Hello: a namespace
        holding another model's KV makes this backend a cache that always
        misses (logged once); another layout is refused (GeometryMismatch)."""
        g = self.geometry
        tp = self.tp if self.tp_rank is not None else 1  # devices one block spans
        if self.ns is None:
            self.ns = self._rank_ns(default_namespace("sglang", {
                "model": self.model, "revision": self.revision, "dtype": g.dtype,
                "layers": g.layers, "kv_heads": g.kv_heads, "head_dim": g.head_dim,
                "block_tokens": g.block_tokens, "tp_size": tp}))
        identity = declared_identity(self.ns, self.model, self.revision, g.dtype, g.layers,
                                     g.kv_heads, g.head_dim, g.block_tokens, tp)

        def make(declare):
            return kvshare.Client(socket_path=self.socket, timeout_ms=self.timeout_ms,
                                  worker_name="sglang", lazy=True, rank=self.tp_rank,
                                  map_pool=declare,
                                  identity=identity if declare else None, **client_options())

        def check(probe):  # as register_mem_pool_host: the devices first
            self._check_group(probe)
            check_geometry(probe.geometry, g, WHO)
        self.client = open_declared(WHO, make, check)

    @staticmethod
    def _new_metrics():
        return {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [],
                "backup_bandwidth": []}

    def _record(self, kind, pages, seconds):
        """One batch for get_stats(): pages moved and GB/s."""
        if pages and self.enable_metrics:
            self._metrics[kind + "_pgs"].append(pages)
            gb = pages * 2 * self.geometry.layers * self.geometry.slot_bytes / 1e9
            self._metrics[kind + "_bandwidth"].append(gb / max(seconds, 1e-9))

    # -- setup --
    def register_mem_pool_host(self, mem_pool_host):
        """Checks the host pool's layout against the daemon's pool (raises
        GeometryMismatch naming both) and maps the pool over it."""
        self.mem_pool_host = mem_pool_host
        layout = getattr(mem_pool_host, "layout", "layer_first")
        self.geometry = EngineGeometry(mem_pool_host.layer_num, mem_pool_host.head_num,
                                       mem_pool_host.head_dim, mem_pool_host.dtype,
                                       mem_pool_host.page_size)
        if layout != "layer_first":
            raise GeometryMismatch("%s: host pool layout %r: only layer_first (a page of one "
                                   "layer's K or V is contiguous, as in kvshared's pool) is "
                                   "supported" % (WHO, layout))
        if self.client is None:
            self._connect()
        if self.client.connected:
            self._check_group()
        self.keys = KeyBlocks(self.client, self.ns, engine=self.geometry, who=WHO)
        if self.client.connected:
            self._copier()

    def _check_group(self, client=None):
        """tp_devices: the daemon serves as many devices as SGLang has TP
        ranks (raises GeometryMismatch)."""
        if self.tp_rank is None:
            return
        size = (client or self.client).group[1]
        if size != self.tp:
            raise GeometryMismatch(
                "%s refuses to start: tp_devices with %d tensor-parallel ranks, and kvshared "
                "serves %d device%s: start kvshared with --devices 0-%d and the geometry of one "
                "rank's KV heads" % (WHO, self.tp, size, "" if size == 1 else "s", self.tp - 1))

    def _alloc(self, digests, held):
        """Blocks for the pages of digests, each also appended to held (to be
        released): with tp_devices, one Alloc per page declaring its key,
        which gives the block another rank declared for it when there is
        one. Raises KvsError."""
        if self.tp_rank is None:
            ids = self.keys.alloc(len(digests))
            held.extend(ids)
            return ids
        self._expire()
        ids = []
        for d in digests:
            ids += self.client.alloc(1, ns=self.ns, tokens=self.keys.tokens(d))
            held.append(ids[-1])
            self._pending.pop(ids[-1], None)  # an older wait on this id is over
        return ids

    def _release(self, held, epoch=None):
        """Releases held (taken in the client's epoch: after a reconnect they
        went with the old session): with tp_devices one by one, since a
        block another rank declared (joined) is not this session's to
        release."""
        if self.tp_rank is None:
            self.keys.release(held, epoch)
            return
        for b in held:
            try:
                self.keys.release([b], epoch)
            except kvshare.KvsError:
                pass

    def _same_session(self, epoch):
        """Raises KvsError when the client reconnected since epoch (a daemon
        restart): the blocks it holds name nothing in the new daemon."""
        if self.client.epoch != epoch:
            raise kvshare.KvsError(kvshare.STATUS["ENOTCONN"], "kvshared restarted")

    def _commit(self, digest, b, held):
        """Commits block b (in held, to be released) under digest; adds to
        held what the commit pinned. With tp_devices, commits this rank's
        shard: a block that still waits for another rank's leaves held (it
        is the group's until every shard is in; _expire gives it back)."""
        if self.tp_rank is None:
            canonical = self.keys.commit(digest, b)
            if canonical != b:
                held.append(canonical)  # stored first by another instance: b stays WRITING
            return
        canon, _ = self.client.commit_group(self.keys.tokens(digest), [b], ns=self.ns)
        if canon:
            if canon[0] != b:
                held.append(canon[0])
        else:
            held.remove(b)
            self._pending[b] = (time.monotonic(), digest)

    def _expire(self):
        """Gives back the blocks whose other shards did not come within
        PENDING_S (a block another rank completed is no longer this
        session's: its release is refused, and ignored)."""
        now = time.monotonic()
        for b in [b for b, (t, _) in self._pending.items() if now - t > PENDING_S]:
            _, digest = self._pending.pop(b)
            if self.keys.find(digest) == b:
                continue  # every shard came: cached
            self._release([b])

    def _copier(self):
        """The copier over the mapped pool, made again after a reconnect."""
        import torch
        if self.copier is not None and self.client.epoch == self._epoch:
            return self.copier
        check_geometry(self.client.geometry, self.geometry, WHO)
        buf = self.mem_pool_host.kv_buffer  # (2, layers, tokens, heads, head_dim)
        ps, slot = self.geometry.block_tokens, self.geometry.slot_bytes
        pages = buf.shape[2] // ps
        pairs = []
        for layer in range(self.geometry.layers):
            for kv in (0, 1):
                rows = buf[kv, layer, :pages * ps].reshape(-1).view(torch.uint8)
                pairs.append((rows.view(pages, slot),
                              pool_rows(torch, self.client, layer, kv, buf.device)))
        self.copier = BlockCopier(pairs)
        self._epoch = self.client.epoch
        return self.copier

    def _pages(self, host_indices, n):
        """The host pool page of each of n pages given by their token indices."""
        ps = self.geometry.block_tokens
        idx = [int(i) for i in host_indices[: n * ps: ps]] if n else []
        if len(host_indices) < n * ps or any(i % ps for i in idx):
            raise ValueError("%s: host indices are not %d whole pages" % (WHO, n))
        return [i // ps for i in idx]

    def _ready(self):
        return self.keys is not None and self.keys.usable()

    # -- the v1 batch interface --
    @guarded(lambda self, keys, extra_info=None: 0)
    def batch_exists(self, keys, extra_info=None):
        """How many leading pages of keys are stored (0 without a daemon)."""
        self.counts["exists"] += 1
        if not self._ready():
            return 0
        n = self.keys.present_run([page_key(k) for k in keys[:MAX_PAGES]])
        self.counts["hits"] += n
        return n

    @guarded(lambda self, keys, *a, **kw: [False] * len(keys))
    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Copies stored pages into the host pool at host_indices; a list of
        one bool per key (False: not stored, or evicted since batch_exists)."""
        self.counts["gets"] += len(keys)
        if not self._ready():
            self.counts["get_failures"] += len(keys)
            return [False] * len(keys)
        pages = self._pages(host_indices, len(keys))
        t0 = time.perf_counter()
        epoch = self.client.epoch
        ids = self.keys.pin([page_key(k) for k in keys])
        got = [(b, p) for b, p in zip(ids, pages) if b is not None]
        try:
            self._same_session(epoch)  # pins of one daemon, copied from its pool
            if got:
                self._copier().load([b for b, _ in got], [p for _, p in got])
            ok = [b is not None for b in ids]
        except (kvshare.KvsError, ValueError):
            ok = [False] * len(keys)
        finally:
            self.keys.release(ids, epoch)
        self.counts["get_failures"] += ok.count(False)
        self._record("prefetch", ok.count(True), time.perf_counter() - t0)
        return ok

    @guarded(lambda self, keys, *a, **kw: [False] * len(keys))
    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Stores pages from the host pool at host_indices; one bool per key
        (True also for a page that was stored already)."""
        self.counts["sets"] += len(keys)
        if not self._ready():
            self.counts["set_failures"] += len(keys)
            return [False] * len(keys)
        pages = self._pages(host_indices, len(keys))
        t0 = time.perf_counter()
        digests = [page_key(k) for k in keys]
        ok = [False] * len(keys)
        todo = []
        for i, d in enumerate(digests):
            if self.keys.find(d) is not None:
                ok[i] = True
                self.counts["set_present"] += 1
            else:
                todo.append(i)
        held = []
        epoch = self.client.epoch
        try:
            ids = self._alloc([digests[i] for i in todo], held)
            self._same_session(epoch)
            self._copier().store([pages[i] for i in todo], ids)
            for i, b in zip(todo, ids):
                self._same_session(epoch)  # never commit an old daemon's id in a new one
                self._commit(digests[i], b, held)
                ok[i] = True
        except (kvshare.KvsError, ValueError):
            pass
        finally:
            # One release per block: a WRITING block goes back to the pool, a
            # committed one loses the commit's pin and stays cached.
            self._release(held, epoch)
        self.counts["set_failures"] += ok.count(False)
        self._record("backup", len(todo) if all(ok) else 0, time.perf_counter() - t0)
        return ok

    # -- the older per-key interface: a page as one tensor --
    def _page_slots(self, page):
        """The (layer, kv) slots of a page tensor laid out [k|v][layer][token]
        [head][head_dim] (contiguous), as byte vectors in the pool's order."""
        import torch
        g = self.geometry
        if not page.is_contiguous() or page.numel() != 2 * g.layers * g.slot_bytes \
                // page.element_size():
            raise ValueError("%s: a page tensor must be contiguous [2][%d][%d][%d][%d]"
                             % (WHO, g.layers, g.block_tokens, g.kv_heads, g.head_dim))
        v = page.view(2, g.layers, -1)
        return [v[kv, layer].view(torch.uint8) for layer in range(g.layers) for kv in (0, 1)]

    @guarded(lambda self, key: False)
    def exists(self, key):
        return self._ready() and self.keys.find(page_key(key)) is not None

    @guarded(lambda self, key, *a, **kw: None)
    def get(self, key, target_location=None, target_sizes=None):
        """The page stored under key (into target_location if given), or None."""
        import torch
        if not self._ready():
            return None
        epoch = self.client.epoch
        [b] = self.keys.pin([page_key(key)])
        if b is None:
            return None
        try:
            self._same_session(epoch)
            g = self.geometry
            out = target_location if target_location is not None else torch.empty(
                (2, g.layers, g.block_tokens, g.kv_heads, g.head_dim),
                dtype=self.mem_pool_host.kv_buffer.dtype)
            for slot, (_, prow) in zip(self._page_slots(out), self._copier().pairs):
                slot.copy_(prow[b])
            return out
        finally:
            self.keys.release([b], epoch)

    @guarded(lambda self, key, *a, **kw: False)
    def set(self, key, value=None, target_location=None, target_sizes=None):
        """Stores one page (value: [k|v][layer][token][head][head_dim])."""
        if not self._ready():
            return False
        digest = page_key(key)
        if self.keys.find(digest) is not None:
            return True
        held = []
        epoch = self.client.epoch
        try:
            slots = self._page_slots(value)
            [b] = self._alloc([digest], held)
            self._same_session(epoch)
            for slot, (_, prow) in zip(slots, self._copier().pairs):
                prow[b].copy_(slot)
            self._same_session(epoch)
            self._commit(digest, b, held)
            return True
        except (kvshare.KvsError, ValueError):
            return False
        finally:
            self._release(held, epoch)

    @guarded(lambda self, keys, *a, **kw: [None] * len(keys))
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        locs = target_locations or [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    @guarded(lambda self, keys, *a, **kw: False)
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return all(self.set(k, v) for k, v in zip(keys, values))

    @guarded(lambda self, key: False)
    def delete(self, key):
        """Drops the page stored under key from kvshared (its Evict RPC), so
        that no instance of the namespace finds it. A page another instance
        is reading at that moment (pinned) stays. Returns True when the page
        is not stored afterwards (also when it never was); never raises."""
        if not self._ready():
            return False
        try:
            _, _, kept = self.client.evict(self.keys.tokens(page_key(key)), ns=self.ns)
            return kept == 0
        except kvshare.KvsError as e:
            return e.status == kvshare.STATUS["ENONS"]  # nothing was ever stored here
        except ValueError:
            return False

    @guarded(lambda self: None)
    def clear(self):
        """Drops the pages of this backend's namespace from kvshared (its
        Clear RPC) and resets this backend's counters. Pages that another
        instance is reading at that moment (pinned) stay, with their
        prefixes; pages being written stay too. The namespace is shared by
        every instance configured with it: they lose the pages as well.
        Never raises: without a daemon there is nothing to drop; a refusal
        (an allow-list, say) is kept in last_clear with the reason."""
        self.counts = dict.fromkeys(self.counts, 0)
        self._metrics = self._new_metrics()
        self.last_clear = None
        if not self._ready():
            why = str(self.keys.refused) if self.keys is not None and self.keys.refused \
                else "no daemon: %s" % (self.client.last_error if self.client else "")
            self.last_clear = {"error": why}
            return
        try:
            cleared, kept = self.client.clear(self.ns)
            self.last_clear = {"cleared": cleared, "kept": kept}
        except kvshare.KvsError as e:
            if e.status == kvshare.STATUS["ENONS"]:  # nothing was ever stored here
                self.last_clear = {"cleared": 0, "kept": 0}
            else:
                self.last_clear = {"error": str(e)}

    @guarded(lambda self: None if StorageMetrics is None else StorageMetrics(
        **KvshareHiCacheStorage._new_metrics()))
    def get_stats(self):
        """What SGLang's storage metrics read: a StorageMetrics with the pages
        and GB/s of each batch_get_v1 (prefetch) and batch_set_v1 (backup)
        since the last call (then emptied); None where SGLang's class does
        not import."""
        m, self._metrics = self._metrics, self._new_metrics()
        return None if StorageMetrics is None else StorageMetrics(**m)

    def stats(self):
        """This backend's counters, what the last clear() did (last_clear:
        pages dropped and kept, or the error), and the namespace's row of the
        daemon's stats (absent without a daemon)."""
        out = dict(self.counts)
        out["failures"] = dict(self.failures.counts)
        if self.last_clear is not None:
            out["last_clear"] = dict(self.last_clear)
        if self.keys is not None and self.keys.refused is not None:
            out["refused"] = str(self.keys.refused)
            return out  # asking the daemon would only be refused again
        if self.client is None:
            return out
        try:
            rows = [r for r in self.client.stats()["namespaces"] if r["name"] == self.ns]
            if rows:
                out["namespace"] = rows[0]
        except kvshare.KvsError:
            pass
        return out
