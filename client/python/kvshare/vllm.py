# SPDX-License-Identifier: Apache-2.0
"""vLLM plug-in: an OffloadingSpec whose offloaded blocks live in kvshared.

vLLM's OffloadingConnector loads the spec by name (docs/ENGINES.md has the
exact --kv-transfer-config line):

    kv_connector_extra_config = {"spec_name": "KvshareOffloadingSpec",
                                 "spec_module_path": "kvshare.vllm",
                                 "socket": "/run/kvshare/kvshared.sock"}

Model identity: without a "namespace" the plug-in uses one derived from the
model vLLM reports ("vllm-SLUG-HASH": name, revision, dtype, geometry,
tensor parallelism), and declares that identity in Hello, so kvshared
refuses a namespace holding another model's KV (KVS_EIDENTITY: logged once,
then a cache that always misses). Instances share blocks only with one
fixed PYTHONHASHSEED (vLLM roots its block hashes in it): without one the
spec refuses to start (check_hash_seed).

Three layouts of vLLM's offloading interface are supported, detected by
what vLLM's modules define (_detect; never by falling back to stand-ins:
without vLLM this module does not import):

  "newest"   vllm/v1/kv_offload/base.py with OffloadingWorker, config.py,
             factory.py: OffloadingSpec(config), get_manager(),
             get_worker(kv_caches); lookup(key, req_context) -> LookupResult.
  "base"     the base-era releases (v0.21 to v0.25): base.py without
             OffloadingWorker, OffloadingSpec(vllm_config, kv_cache_config),
             get_handlers(kv_caches), lookup(key, req_context) -> bool.
  "abstract" abstract.py, spec.py, mediums.py, worker/worker.py (the older
             releases): get_handlers(kv_caches, attn_backends),
             lookup(block_hashes) -> int.

Every entry point is guarded (keyblocks.guarded): a kvshare failure is a
miss, a declined store or nothing, never an exception in vLLM's threads;
the clients have the library's circuit breaker.

All share one scheduler core and one worker core:

Scheduler (one session per scheduler process). A lookup that answers "hit"
has pinned the block in that session, so it cannot be evicted or cleared
before its load; a lookup that cannot be served (no daemon, not stored, the
worker has not mapped this daemon's pool) answers "miss", and vLLM computes
those tokens itself. The pin is handed to the load by prepare_load and
dropped by complete_load (or when the request ends). prepare_store only
decides which keys are new; nothing is allocated by the scheduler.

Worker (one per worker process). Stores: the worker allocates blocks in its
own session, copies the engine's KV into them and commits them itself, so a
block becomes visible only once its bytes are all there, whatever order the
scheduler calls complete_store in (vLLM calls it early on preemption in some
versions). Loads: the worker copies the blocks the scheduler pinned, from its
mapping of the very daemon that holds the pins (named by the daemon's start
time): a daemon that dies after the lookup leaves that mapping readable, so
the load is still served. vLLM asserts that every transfer succeeds ("we
currently do not support job failures"), so transfers are reported done: a
store that cannot be made is simply not stored (a later miss). The one
exception is a load that reaches the worker more than KEEP_OLD_POOL_S after
its daemon left the state file (WorkerCore._load): nothing is left to read
it from.

The worker writes the start times of the pools it has mapped to a small
state file; the scheduler answers "hit" only for a daemon in that file.

Tensor parallelism (newest layout; tp_size workers, no pipeline or context
parallelism): one kvshared serves the group (`kvshared --devices 0-(tp-1)`,
the geometry of one rank's KV heads). Each worker connects as its rank
(KVS_RANK: it maps only its device's pool); the scheduler connects as the
group's scheduler. A store's blocks must have the same ids on every rank,
and only the scheduler sees all ranks' stores, so the scheduler allocates
them in prepare_store (in its session) and names them in the store spec;
each worker copies its heads into its device's blocks and commits its
shard, and the daemon caches a block only once every rank committed its
shard: a worker that cannot store (vLLM lets it report no failure) leaves
the block uncached. complete_store (called by vLLM once every worker's job
is done) makes no RPC: a thread with a session of its own finds what stayed
uncached, and the scheduler gives it back in one Release at its next call.
Lookups and loads are as for one worker: the scheduler's pin holds the
block on every device, each worker copies its own heads; a hit needs every
rank to have mapped the daemon (one state file per rank).
"""
import collections
import os
import queue
import re
import tempfile
import threading
import time

import kvshare
from kvshare.keyblocks import (EngineGeometry, Failures, GeometryMismatch, KeyBlocks,
                               check_geometry, client_options, declared_identity,
                               default_namespace, guarded, open_declared)
from kvshare.tensors import BlockCopier, StreamOrder, pool_rows

def _module(name):
    """vLLM's module `name`, or None when vLLM has no such module. An
    ImportError raised inside a module that exists is not hidden: it is a
    broken install, not another layout."""
    import importlib
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name):
            return None  # the module (or a package above it) does not exist
        raise


def _detect():
    """(layout, base module, worker module): the layout of vLLM's offloading
    interface, by what its modules define (a module that imports is not
    enough: base.py exists in two layouts):

      "newest"    base.py defines OffloadingWorker and a spec with get_worker
      "base"      base.py defines the manager and a spec with get_handlers;
                  the handler is in worker/worker.py (v0.21 to v0.25)
      "abstract"  abstract.py, spec.py, mediums.py, worker/worker.py
                  (the older releases)"""
    base = _module("vllm.v1.kv_offload.base")
    if base is not None and hasattr(base, "OffloadingManager"):
        spec = getattr(base, "OffloadingSpec", None)
        if hasattr(base, "OffloadingWorker") and hasattr(spec, "get_worker"):
            return "newest", base, None
        if hasattr(spec, "get_handlers"):
            worker = _module("vllm.v1.kv_offload.worker.worker")
            if worker is not None and hasattr(worker, "OffloadingHandler"):
                return "base", base, worker
    if _module("vllm.v1.kv_offload.abstract") is not None:
        from vllm.v1.kv_offload import abstract, mediums, spec
        from vllm.v1.kv_offload.worker import worker
        ns = type("abstract_era", (), {})
        for mod in (abstract, mediums, spec):
            for k, v in vars(mod).items():
                if not k.startswith("_"):
                    setattr(ns, k, v)
        return "abstract", ns, worker
    raise ImportError("kvshare.vllm needs vLLM's offloading interface (vllm.v1.kv_offload."
                      "base with OffloadingWorker or get_handlers, or abstract/spec/mediums/"
                      "worker of the older releases); none of them is in this vLLM")


LAYOUT, _base, _worker = _detect()
LoadStoreSpec = _base.LoadStoreSpec
GPULoadStoreSpec = _base.GPULoadStoreSpec
OffloadingManager = _base.OffloadingManager
OffloadingSpec = _base.OffloadingSpec
PrepareStoreOutput = _base.PrepareStoreOutput
OffloadingEvent = _base.OffloadingEvent
if LAYOUT == "newest":
    OffloadingWorker = _base.OffloadingWorker
    TransferResult = _base.TransferResult
else:
    OffloadingHandler = _worker.OffloadingHandler
    TransferResult = getattr(_worker, "TransferResult", None)
# The manager's calls take a request context (newest, base) or block hashes
# alone (abstract).
KEYED = LAYOUT != "abstract"

MEDIUM = "KVSHARE"
WHO = "kvshare.vllm"
# Two start times closer than this name one daemon. A start time is the
# wall clock minus the daemon's uptime (ms), read over an RPC: off by up to
# half its round trip (daemon_start_ms). Daemons restarted on one socket
# closer together than this would look alike (kvshared's Hello names no
# daemon instance).
SAME_DAEMON_MS = 200
# A pool mapping the worker no longer advertises is kept this long, for
# loads the scheduler planned just before it stopped advertising it.
KEEP_OLD_POOL_S = 30.0
# Lookup pins of the release layout (which names no request) that no
# prepare_load took within this long are dropped (extra config
# lookup_pin_ttl_s); a lookup in a later step pins again. Less than
# KEEP_OLD_POOL_S, so a pin is never older than the mapping it is read from.
LOOKUP_PIN_TTL_S = 10.0
# How often the worker checks, between transfers, that its daemon is still
# the one it mapped (a ping).
PING_S = 0.05
# Keys of finished stores waiting to be looked up for KV events (events on
# only); more are dropped and counted (events_dropped).
MAX_EVENT_KEYS = 65536
# Tensor parallelism: how long a worker waits at start for every rank of its
# group to show up on this node (extra config group_wait_s).
GROUP_WAIT_S = 60.0


class HashSeedRefused(ValueError):
    """vLLM is configured so that no two instances could ever share a block:
    the plug-in refuses to start rather than run as a cache that never hits."""


def check_hash_seed(algo=None, environ=None):
    """Raises HashSeedRefused when vLLM's prefix block hashes differ in every
    process. vLLM roots every chain of block hashes in NONE_HASH
    (v1/core/kv_cache_utils.py, init_none_hash): os.urandom(32) when
    PYTHONHASHSEED is unset, else the hash function of its value. So:
    PYTHONHASHSEED unset, whatever the algorithm; and the builtin algorithm
    (Python's hash(): keys that are not bytes, randomised per process
    unless PYTHONHASHSEED fixes it). algo: vLLM's prefix_caching_hash_algo
    where the engine tells it (the releases' VllmConfig), else None."""
    environ = os.environ if environ is None else environ
    seed = environ.get("PYTHONHASHSEED")
    if str(algo or "") in ("builtin", "hash"):
        raise HashSeedRefused(
            "%s refuses to start: --prefix-caching-hash-algo %s hashes blocks with Python's "
            "hash(), whose values are not bytes and (PYTHONHASHSEED %s) differ in every "
            "process, so no two instances could share a block; start vLLM with "
            "--prefix-caching-hash-algo sha256_cbor (or sha256) and PYTHONHASHSEED set to one "
            "fixed value (for example 0) on every instance"
            % (WHO, algo, "unset" if seed is None else "=" + seed))
    if seed is None:
        raise HashSeedRefused(
            "%s refuses to start: PYTHONHASHSEED is not set, so vLLM draws the root of its "
            "prefix block hashes (NONE_HASH) from os.urandom in each process: no two instances "
            "would ever hash a prompt alike, and kvshare would only miss; set PYTHONHASHSEED "
            "to one fixed value (for example PYTHONHASHSEED=0) in the environment of every "
            "vLLM instance that shares this kvshared" % WHO)


def daemon_start_ms(client, samples=3):
    """The daemon's start time (wall clock, ms) seen through client: it
    names one daemon instance. Of `samples` Stats RPCs, the one with the
    shortest round trip, taken at its midpoint (a loaded machine delays
    some replies by tens of ms). Raises KvsError without a daemon."""
    best = None
    for _ in range(samples):
        t0 = time.time()
        up = client.stats()["uptime_ms"]
        t1 = time.time()
        if best is None or t1 - t0 < best[0]:
            best = (t1 - t0, (t0 + t1) * 500.0 - up)
    return int(best[1])


def _state_file(extra, engine_id, ns):
    """The file where the worker lists the pools it has mapped."""
    path = extra.get("state_file")
    if path:
        return path
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", "%s-%s" % (engine_id or "engine", ns))
    return os.path.join(tempfile.gettempdir(), "kvshare-vllm-%d-%s.pools" % (os.getuid(), name))


def read_pools(path):
    """The start times the worker advertises (a set, empty without a file)."""
    try:
        with open(path) as f:
            return {int(x) for x in f.read().split()}
    except (OSError, ValueError):
        return set()


def write_pools(path, starts):
    """Replaces the file atomically (the scheduler may read it meanwhile)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(" ".join(str(s) for s in starts))
    os.replace(tmp, path)


def _near(a, b):
    return a is not None and b is not None and abs(a - b) <= SAME_DAEMON_MS


class KvshareLoadStoreSpec(LoadStoreSpec):
    """What the worker needs for one transfer. A load: the keys, the blocks
    the scheduler pinned for them and the start time of the daemon that
    holds the pins. A store: the keys to store (the worker allocates)."""

    def __init__(self, keys, block_ids=None, daemon_start=None):
        # A store of a tensor-parallel group names the blocks the scheduler
        # allocated for it (the same ids on every rank); one worker's store
        # names none (the worker allocates).
        self.keys = [bytes(k) for k in keys]
        self.block_ids = [int(b) for b in block_ids] if block_ids is not None else None
        self.daemon_start = daemon_start

    @staticmethod
    def medium():
        return MEDIUM

    def __repr__(self):
        return "KvshareLoadStoreSpec(%d keys, blocks=%r, daemon=%r)" % (
            len(self.keys), self.block_ids, self.daemon_start)


# -- the scheduler core ---------------------------------------------------------

class SchedulerCore:
    """Pins at lookup, per owner (a request id, or None), in the scheduler's
    session. Every pin remembers the connection (epoch) it was taken in:
    after a reconnect the old pins are gone with the old daemon and are
    never released by id in the new one."""

    def __init__(self, spec, client, events=False):
        """events: vLLM's KV events are on (else nothing is kept for
        take_events). complete_store makes no RPC: what it must learn from
        kvshared (which keys are stored, for events and a group's give-back)
        is looked up by the finder's thread, in a session of its own."""
        self.spec = spec
        self.finder = _StoredKeys(spec, events) if events or spec.tp > 1 else None
        self.events = self.finder if events else None
        self.keys = KeyBlocks(client, spec.ns, who=WHO)
        self.client = client
        self.state_file = spec.state_file
        self.refused = None  # a daemon that came back with another layout
        self._start = None
        self._start_epoch = None
        self._last_ping = 0.0
        self._pins = collections.defaultdict(dict)  # owner -> key -> (block, epoch, start, t)
        self._loading = collections.defaultdict(list)  # (owner, key) -> [(block, epoch)]
        self._storing = set()
        self._store_blocks = {}  # a group: key -> (block, epoch) the scheduler allocated
        self._pools, self._pools_stamp = set(), None
        self.counts = {"lookups": 0, "hits": 0, "misses_unmapped": 0, "stores_planned": 0}

    def _daemon(self):
        """The start time of the daemon the scheduler talks to, or None."""
        if self.refused is not None or not self.keys.usable():
            return None
        if self._start_epoch != self.client.epoch:
            try:
                self.spec.resolve(self.client.geometry)
                self._start = daemon_start_ms(self.client)
            except GeometryMismatch as e:
                self.refused = e
                return None
            except kvshare.KvsError:
                return None
            self._start_epoch = self.client.epoch
        return self._start

    def _recheck(self):
        """The daemon's start time again, after a ping (at most every PING_S):
        the worker maps a restarted daemon before the scheduler has made a
        call that finds its own connection gone."""
        now = time.monotonic()
        if now - self._last_ping < PING_S:
            return self._daemon()
        self._last_ping = now
        try:
            self.client.ping()
        except kvshare.KvsError:
            pass  # dropped: _daemon() reconnects, or the breaker makes it a miss
        return self._daemon()

    def _worker_pools(self):
        """The daemons the worker has mapped (read_pools; a group: those
        every rank has mapped), read again only when a file was replaced."""
        stamp = []
        for path in self.spec.state_files():
            try:
                st = os.stat(path)
            except OSError:
                return set()
            stamp.append((st.st_ino, st.st_mtime_ns, st.st_size))
        if stamp != self._pools_stamp:
            sets = [read_pools(path) for path in self.spec.state_files()]
            self._pools = {s for s in sets[0] if all(any(_near(s, t) for t in o)
                                                     for o in sets[1:])}
            self._pools_stamp = stamp
        return self._pools

    def pinned(self, owner, key):
        got = self._pins.get(owner, {}).get(key)
        return got is not None and got[1] == self.client.epoch

    def lookup(self, owner, key):
        """True (a hit, pinned for owner) or False (a miss)."""
        self.counts["lookups"] += 1
        self.give_back()
        if self.pinned(owner, key):
            self.counts["hits"] += 1
            return True
        start = self._daemon()
        if start is None:
            return False
        if not any(_near(start, s) for s in self._worker_pools()):
            start = self._recheck()
        if start is None or not any(_near(start, s) for s in self._worker_pools()):
            self.counts["misses_unmapped"] += 1
            return False  # the worker could not read this daemon's pool
        epoch = self.client.epoch
        [block] = self.keys.pin([key])
        if block is None:
            return False
        if self.client.epoch != epoch:  # reconnected in between: another daemon
            self._release([(block, self.client.epoch)])
            return False
        self._pins[owner][key] = (block, epoch, start, time.monotonic())
        self.counts["hits"] += 1
        return True

    def load_spec(self, owner, keys, drop_rest=False):
        """Hands the lookup pins of keys to a load (drop_rest: and drops the
        owner's other lookup pins, which no load of this request will take).
        Raises AssertionError for a key no lookup of this owner pinned (vLLM
        loads only what its lookups found)."""
        ids, start = [], None
        for key in keys:
            got = self._pins.get(owner, {}).pop(key, None)
            if got is None and self.lookup(owner, key):
                # Its pin expired (layouts without on_request_finished), or
                # another load of the same key took it (abstract: one owner).
                got = self._pins[owner].pop(key)
            if got is None:
                raise AssertionError("%s: prepare_load of a block no lookup found" % WHO)
            block, epoch, s, _ = got
            self._loading[(owner, key)].append((block, epoch))
            ids.append(block)
            if start is not None and not _near(start, s):
                raise AssertionError("%s: one load over two daemons" % WHO)
            start = s
        if drop_rest:
            self.release_owner(owner)
        return KvshareLoadStoreSpec(keys, ids, start)

    def complete_load(self, owner, keys):
        done = []
        for key in keys:
            held = self._loading.get((owner, key))
            if held:
                done.append(held.pop())
                if not held:
                    del self._loading[(owner, key)]
        self._release(done)

    def _release(self, pins):
        ids = [b for b, epoch in pins if epoch == self.client.epoch]
        try:
            self.keys.release(ids)
        except kvshare.KvsError:
            pass  # gone with the daemon or the session

    def release_owner(self, owner):
        """Drops owner's lookup pins that no load took."""
        pins = self._pins.pop(owner, {})
        self._release([(b, e) for b, e, _, _ in pins.values()])

    def expire(self, ttl):
        """Drops lookup pins older than ttl seconds (the release layout)."""
        now = time.monotonic()
        for owner in list(self._pins):
            old = [k for k, (_, _, _, t) in self._pins[owner].items() if now - t > ttl]
            for k in old:
                b, e, _, _ = self._pins[owner].pop(k)
                self._release([(b, e)])

    def plan_store(self, keys):
        """The keys that are neither stored nor being stored, and (a group)
        the blocks allocated for them, or None. Raises KvsError without a
        daemon or, for a group, when the pool has no room (vLLM then skips
        the store)."""
        self.give_back()
        start = self._daemon()
        if start is None:
            raise kvshare.KvsError(kvshare.STATUS["ENOTCONN"], self.client.last_error or
                                   "no daemon")
        todo = [k for k in keys if k not in self._storing and self.keys.find(k) is None]
        ids = None
        if self.spec.tp > 1 and todo:
            epoch = self.client.epoch
            ids = self.keys.alloc(len(todo))  # raises: nothing is marked yet
            self._store_blocks.update((k, (b, epoch)) for k, b in zip(todo, ids))
        self._storing.update(todo)
        self.counts["stores_planned"] += len(todo)
        return todo, ids, start

    def complete_store(self, keys, success=True):
        """Forgets keys as being stored; makes no RPC on the scheduler's
        step. With KV events on, the keys go to the finder's thread, which
        finds which are stored. A group: the keys and the blocks allocated
        for them go to that thread too, which finds the blocks whose shards
        did not all come (a block every rank committed is cached, and no
        longer the scheduler's); the scheduler gives those back in one
        Release at its next call (give_back)."""
        mine = [k for k in keys if k in self._storing]
        self._storing.difference_update(mine)
        if self.spec.tp == 1:
            if self.events is not None and success and mine:
                self.events.put(mine)
            return
        self.give_back()
        held = {k: self._store_blocks.pop(k) for k in mine if k in self._store_blocks}
        if held or (self.events is not None and success and mine):
            self.finder.put(mine, held, events=success)

    def give_back(self):
        """Releases, in one RPC, the group's blocks the finder found
        uncached (their key missing, or held by another instance's block).
        A block id the scheduler's session holds again for something else
        since (a later store's block, a lookup's pin: the daemon evicted
        and reused it meanwhile) is not released. Never raises."""
        if self.finder is None or not self.finder.give:
            return
        epoch = self.client.epoch
        taken = set()
        for b, e in self._store_blocks.values():
            taken.add((b, e))
        for pins in self._pins.values():
            taken.update((b, e) for b, e, _, _ in pins.values())
        for held in self._loading.values():
            taken.update(held)
        ids = []
        while self.finder.give:
            b, e = self.finder.give.popleft()
            if e == epoch and (b, e) not in taken:
                ids.append(b)
        if not ids:
            return
        try:
            self.keys.release(ids, epoch)
        except kvshare.KvsError:
            # The daemon stops at a block this session no longer holds (a
            # rank's end took it back already): the others one by one.
            for b in ids:
                try:
                    self.keys.release([b], epoch)
                except kvshare.KvsError:
                    pass

    def take_stored(self):
        """Lists of keys found stored since the last call (events on)."""
        self.give_back()
        if self.events is None:
            return []
        out = []
        while self.events.found:
            out.append(self.events.found.popleft())
        return out

    def close(self):
        if self.finder is not None:
            self.finder.close()
        self.client.close()


class _StoredKeys:
    """Which keys of finished stores are in the pool, found off the
    scheduler's step: a thread with a session of its own (no pins, no
    rank: it connects as the scheduler does) looks each key up. For vLLM's
    KV events, found holds lists of keys found, for take_events. For a
    tensor-parallel group, give holds (block, epoch) of the blocks the
    scheduler allocated whose key did not end up in them, for its next
    give_back. Made when vLLM's KV events are on or the engine is a group.

    Events beyond MAX_EVENT_KEYS waiting are dropped (counted); a group's
    blocks never are: the scheduler holds at most what Alloc gave it, so
    they are bounded by the pool."""

    def __init__(self, spec, events=True):
        self.spec = spec
        self.events = events
        self.found = collections.deque()
        self.give = collections.deque()
        self.dropped = 0
        self._queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = None

    def put(self, keys, held=None, events=True):
        """keys: of a finished store; held: key -> (block, epoch) the
        scheduler allocated for them (a group); events: a stored event is
        wanted for the keys found (a store that succeeded, events on)."""
        events = events and self.events
        with self._lock:
            if events and self._pending + len(keys) > MAX_EVENT_KEYS:
                self.dropped += len(keys)
                events = False
            if not events and not held:
                return
            self._pending += len(keys)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kvshare-events",
                                                daemon=True)
                self._thread.start()
        self._queue.put((keys, held or {}, events))

    def idle(self):
        """Whether every batch put has been looked up."""
        with self._lock:
            return self._pending == 0

    def _run(self):
        keys = client = None
        try:
            client = self.spec.connect(False, "vllm-events", scheduler=True)
            keys = KeyBlocks(client, self.spec.ns, who=WHO)
        except Exception:  # noqa: BLE001 - no session: no events, counted
            keys = None
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            batch, held, events = batch
            found = {k: keys.find(k) if keys is not None else None for k in batch}
            for k, (b, e) in held.items():
                if found.get(k) != b:
                    self.give.append((b, e))
            stored = [k for k in batch if found[k] is not None]
            if events and stored:
                self.found.append(stored)
            elif events and keys is None:
                self.dropped += len(batch)
            with self._lock:
                self._pending -= len(batch)
        if client is not None:
            client.close()

    def close(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(5)


# -- the worker core --------------------------------------------------------------

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


class _Mapping:
    """One daemon's pool mapped by the worker: a client used for nothing
    but its mapping once made (a call to a dead daemon would unmap it, and
    pinned blocks must stay readable), and the copier over it."""

    def __init__(self, spec, tensors, device):
        import torch
        self.client = spec.connect(True, "vllm-worker-pool", lazy=False)
        try:
            spec.resolve(self.client.geometry)
            geo = spec.geometry
            rows = slot_tensors(torch, tensors, geo, spec.factor)
            self.start = daemon_start_ms(self.client)
            pool = [pool_rows(torch, self.client, layer, kv, device)
                    for layer in range(geo.layers) for kv in (0, 1)]
            self.copier = BlockCopier(list(zip(rows, pool)), factor=spec.factor)
        except BaseException:
            self.client.close()
            raise
        self.last_used = time.monotonic()
        self.dropped_at = None

    def close(self):
        self.client.close()


class WorkerCore:
    """Copies between the worker's KV tensors and pool blocks, in a thread.

    submit(job_id, load, src, dst) queues a job and returns True; jobs run
    in order; finished() gives the TransferResult of each job done since
    the last call, always with success=True (see the module doc); wait()
    blocks until the given jobs are done."""

    def __init__(self, spec, tensors, make_result):
        self.spec = spec
        self.tensors = tensors
        self.device = tensors[0].device
        self.make_result = make_result
        self.rpc = spec.connect(False, "vllm-worker")
        self.keys = KeyBlocks(self.rpc, spec.ns, who=WHO)
        self._maps = []  # newest first
        self._rpc_epoch = None
        self._last_ping = 0.0
        self._lock = threading.RLock()  # the session (rpc) and the mappings
        self.counts = {"loads": 0, "stores": 0, "stored_blocks": 0, "store_skipped": 0,
                       "load_unserved": 0}
        self.last_error = None
        self._jobs = queue.Queue()
        self._done = []
        self._pending = set()
        self._direction = {}  # job id -> load (True) or store
        self._cond = threading.Condition()
        self.refused = None
        self.failures = Failures(WHO)
        # GPU copies wait for the engine's stream and are waited for by
        # event (StreamOrder); CPU tensors need no ordering.
        self.order = StreamOrder.for_device(self.device)
        if spec.tp > 1:
            spec.check_one_node()
        self._starting = True
        self.refresh()  # maps the pool and checks its layout now, when the daemon is up
        self._starting = False
        self._thread = threading.Thread(target=self._run, name="kvshare-copy", daemon=True)
        self._thread.start()

    # -- pool mappings --
    def refresh(self, force=False, wait=True):
        """Maps the pool of the daemon the worker's session talks to (again
        after a restart) and advertises it; returns that mapping or None.
        A connection is only known dead after I/O on it, so this pings (at
        most every PING_S unless force) before trusting it. The session is
        used by one thread at a time (the lock); with wait=False, returns
        None at once while the copy thread is using it."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if self.keys.refused is not None:
                return None  # refused for good: no Hello every PING_S
            now = time.monotonic()
            if force or now - self._last_ping >= PING_S:
                self._last_ping = now
                try:
                    self.rpc.ping()
                except kvshare.KvsError:
                    pass  # dropped: usable() reconnects
            if not self.keys.usable():
                return None
            if self._rpc_epoch == self.rpc.epoch and self._maps:
                return self._maps[0]
            if self.refused is not None:
                return None
            try:
                start = daemon_start_ms(self.rpc)
                current = next((m for m in self._maps if _near(m.start, start)), None)
                if current is None:
                    current = _Mapping(self.spec, self.tensors, self.device)
                    self._maps.insert(0, current)
            except kvshare.KvsError as e:
                self.last_error = e
                return None
            except GeometryMismatch as e:
                if self._starting:
                    raise  # get_worker refuses to start
                # A daemon that came back with another layout: never mapped,
                # so the scheduler never finds it in the state file (misses).
                self.refused = self.last_error = e
                return None
            self._rpc_epoch = self.rpc.epoch
            self._forget_old()
            write_pools(self.spec.worker_state_file(), [m.start for m in self._maps
                                                        if m.dropped_at is None])
            return current
        finally:
            self._lock.release()

    def _forget_old(self):
        """Stops advertising all but the newest mapping; closes one that has
        not been advertised or used for KEEP_OLD_POOL_S."""
        now = time.monotonic()
        keep = self._maps[:1]
        for m in self._maps[1:]:
            if m.dropped_at is None:
                m.dropped_at = now
            if now - max(m.dropped_at, m.last_used) > KEEP_OLD_POOL_S:
                m.close()
            else:
                keep.append(m)
        self._maps = keep

    def _mapping(self, start):
        with self._lock:
            m = next((m for m in self._maps if _near(m.start, start)), None)
            if m is not None:
                m.last_used = time.monotonic()
            return m

    # -- transfers --
    def _load(self, spec, gpu_ids, skip, mark=None):
        """Pool blocks spec.block_ids (pinned by the scheduler in the daemon
        spec.daemon_start) -> GPU blocks, once the engine's stream reached
        mark (StreamOrder)."""
        m = self._mapping(spec.daemon_start)
        if m is None:
            self.refresh()
            m = self._mapping(spec.daemon_start)
        if m is None:
            # The scheduler found this daemon in the state file, and a mapping
            # is kept KEEP_OLD_POOL_S after it leaves the file: a load planned
            # that long before it runs. Nothing to read from.
            self.counts["load_unserved"] += 1
            raise RuntimeError("%s: no mapping of the daemon started at %s ms holds the blocks "
                               "of this load" % (WHO, spec.daemon_start))
        self.order.run(mark, lambda: m.copier.load(spec.block_ids, gpu_ids, skip=skip))
        self.counts["loads"] += 1
        return len(gpu_ids) * m.copier.bytes_per_block // m.copier.factor

    def _store(self, spec, gpu_ids, mark=None):
        """GPU blocks -> new pool blocks, committed under spec.keys once
        copied (after the engine's stream reached mark). Returns bytes
        stored; stores nothing (0) when the daemon is unreachable or full
        of pinned blocks."""
        with self._lock:
            return self._store_locked(spec, gpu_ids, mark)

    def _store_locked(self, spec, gpu_ids, mark):
        f = self.spec.factor
        keys = spec.keys[:len(gpu_ids) // f]
        if not keys:
            return 0
        if self.spec.tp > 1:
            return self._store_shard(spec, keys, gpu_ids, mark)
        m = self.refresh(force=True)
        if m is None:
            self.counts["store_skipped"] += len(keys)
            return 0
        held = []
        try:
            ids = self.keys.alloc(len(keys))
            held = list(ids)
            if self.rpc.epoch != self._rpc_epoch:  # reconnected: ids are another pool's
                raise kvshare.KvsError(kvshare.STATUS["ENOTCONN"], "the daemon restarted")
            self.order.run(mark, lambda: m.copier.store(
                [int(b) for b in gpu_ids][:len(keys) * f], ids))
            # Committed only now that every byte is in place.
            for key, b in zip(keys, ids):
                held.append(self.keys.commit(key, b))  # the commit's pin, dropped below
            self.counts["stores"] += 1
            self.counts["stored_blocks"] += len(keys)
            return len(keys) * m.copier.bytes_per_block
        except (kvshare.KvsError, ValueError) as e:
            self.last_error = e
            self.counts["store_skipped"] += len(keys)
            return 0
        finally:
            # A WRITING block goes back to the pool, a committed one keeps its
            # data unpinned; a duplicate (another instance committed the key
            # first) is a WRITING block freed here.
            if self.rpc.epoch == self._rpc_epoch:
                try:
                    self.keys.release(held)
                except kvshare.KvsError:
                    pass

    def _store_shard(self, spec, keys, gpu_ids, mark=None):
        """A rank of a group: this worker's heads into the blocks the
        scheduler allocated (spec.block_ids, in the daemon spec.daemon_start),
        then its shard committed per key. The commit that brings a block's
        last shard caches it, pinned by this session (dropped here), and
        names the block that holds the key: another one when another
        instance stored the key first (then ours is dropped too). Returns
        bytes stored; stores nothing when this worker does not map that
        daemon (the block then never becomes cached)."""
        ids = (spec.block_ids or [])[:len(keys)]
        m = self.refresh(force=True)
        if m is None or len(ids) < len(keys) or not _near(m.start, spec.daemon_start):
            self.counts["store_skipped"] += len(keys)
            return 0
        try:
            self.order.run(mark, lambda: m.copier.store(
                [int(b) for b in gpu_ids][:len(keys) * self.spec.factor], ids))
            for key, b in zip(keys, ids):
                canon, _ = self.rpc.commit_group(self.keys.tokens(key), [b], ns=self.keys.ns)
                if canon:
                    self.keys.release(canon + ([b] if canon[0] != b else []))
            self.counts["stores"] += 1
            self.counts["stored_blocks"] += len(keys)
            return len(keys) * m.copier.bytes_per_block
        except (kvshare.KvsError, ValueError) as e:
            self.last_error = e
            self.counts["store_skipped"] += len(keys)
            return 0

    def submit(self, job_id, load, src, dst):
        """Queues a job (in the engine's thread: the mark of its stream is
        taken now, so the copy sees every kernel queued before)."""
        mark = self.order.mark()
        with self._cond:
            self._pending.add(job_id)
            self._direction[job_id] = load
        self._jobs.put((job_id, load, src, dst, mark))
        return True

    def submit_failed(self, job_id, load):
        """A job whose submission failed inside the plug-in: reported done at
        once (vLLM asserts every submission), a store as storing nothing, a
        load as failed (unreachable: a submission only queues)."""
        result = self.make_result(job_id, not load, 0, 0.0)
        with self._cond:
            self._direction[job_id] = load
            self._pending.discard(job_id)
            self._done.append(result)
            self._cond.notify_all()
        return True

    def _run(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job_id, load, src, dst, mark = job
            t0 = time.monotonic()
            if load:
                skip = 0
                indices = getattr(dst, "block_indices", None)
                if indices is not None and len(indices):
                    skip = int(indices[0]) % self.spec.factor
                try:
                    size = self._load(src, [int(b) for b in dst.block_ids], skip, mark)
                except Exception as e:  # noqa: BLE001 - kept for the logs and tests
                    self.last_error = e
                    self.failures.note("load", e)
                    size = 0
                    ok = False
                else:
                    ok = True
            else:
                try:
                    size = self._store(dst, src.block_ids, mark)
                except Exception as e:  # noqa: BLE001 - a store not made is no failure
                    self.last_error = e
                    self.failures.note("store", e)
                    self.counts["store_skipped"] += len(getattr(dst, "keys", ()))
                    size = 0
                ok = True
            result = self.make_result(job_id, ok, size, time.monotonic() - t0)
            with self._cond:
                self._pending.discard(job_id)
                self._done.append(result)
                self._cond.notify_all()

    def finished(self, load=None):
        """Results of the jobs done since the last call (of one direction
        when load is True or False)."""
        done, keep = [], []
        with self._cond:
            for r in self._done:
                job = r[0] if isinstance(r, tuple) else r.job_id
                if load is None or self._direction.get(job) == load:
                    done.append(r)
                    self._direction.pop(job, None)
                else:
                    keep.append(r)
            self._done = keep
        return done

    def wait(self, job_ids):
        with self._cond:
            while self._pending & set(job_ids):
                self._cond.wait()

    def shutdown(self):
        self._jobs.put(None)
        self._thread.join()
        for m in self._maps:
            m.close()
        self._maps = []
        self.rpc.close()
        try:
            os.unlink(self.spec.worker_state_file())  # nothing is mapped any more
        except OSError:
            pass


# -- the spec: what both layouts share ----------------------------------------------

class _SpecMixin:
    """Reads the extra config; builds the cores."""

    def _setup(self, extra, engine_id, world_size, geometry, factor, parallel=None, model=None):
        """parallel: vLLM's OffloadingParallelConfig (newest layout), or None.
        model: what vLLM reports of the model's identity (a dict: model,
        revision, dtype, and the geometry it knows), for the default
        namespace and the identity declared in Hello."""
        model = dict(model or {})
        self.extra = extra
        self.socket = extra.get("socket")
        self.timeout_ms = int(extra.get("timeout_ms", 1000))
        self.tp, self.rank = 1, 0
        if world_size > 1:
            tp = int(getattr(parallel, "tp_size", 0) or 0)
            others = [getattr(parallel, f, 1) for f in ("pp_size", "pcp_size", "dcp_size")]
            if parallel is None or tp != world_size or any(int(o or 1) != 1 for o in others):
                # Pipeline or context ranks hold other layers or tokens of a
                # block: one pool block per key would mix them.
                raise GeometryMismatch(
                    "%s: %d workers (pipeline or context parallel, or vLLM's releases): "
                    "kvshare.vllm supports one worker per engine, or tensor parallelism alone "
                    "with vLLM's newest offloading interface" % (WHO, world_size))
            self.tp, self.rank = tp, int(parallel.rank) % tp
        self.geometry = geometry
        self.factor = factor
        # An explicit namespace wins; else one per model identity, never one
        # for every model (a fine-tune would read its base model's KV).
        self.ns = extra.get("namespace")
        if not self.ns:
            if not model.get("model"):
                raise ValueError("%s: vLLM reported no model name; set \"namespace\" in "
                                 "kv_connector_extra_config" % WHO)
            self.ns = default_namespace("vllm", dict(model, tp_size=self.tp))
        self.state_file = _state_file(extra, engine_id, self.ns)
        self.identity = declared_identity(
            self.ns, model.get("model"), model.get("revision"), model.get("dtype"),
            layers=geometry.layers, kv_heads=geometry.kv_heads, head_dim=geometry.head_dim,
            block_tokens=geometry.block_tokens, tp_size=self.tp)

    def state_files(self):
        """The workers' state files: one per rank of a group."""
        if self.tp == 1:
            return [self.state_file]
        return ["%s.rank%d" % (self.state_file, r) for r in range(self.tp)]

    def worker_state_file(self):
        return self.state_files()[self.rank if self.tp > 1 else 0]

    def connect(self, map_pool, name, lazy=True, scheduler=False):
        """A client (lazy: a daemon that is down makes lookups misses, never
        errors); checks the pool's layout, and the daemon's devices against
        the group, when the daemon is up (raises GeometryMismatch). A group:
        the scheduler connects as the group's scheduler, a worker as its
        rank."""
        group = {}
        if self.tp > 1:
            group = {"group_scheduler": True} if scheduler else {"rank": self.rank}

        def make(declare, lazy=lazy):
            return kvshare.Client(socket_path=self.socket, timeout_ms=self.timeout_ms,
                                  worker_name=name, map_pool=map_pool and not scheduler,
                                  lazy=lazy, identity=self.identity if declare else None,
                                  **group, **client_options())

        def check(probe):
            self.resolve(probe.geometry)
            self.check_group(probe)
        if lazy:
            # A namespace that holds another model's KV: a cache that always
            # misses (logged once); another layout: refused here.
            client = open_declared(WHO, lambda declare: make(declare, True), check)
        else:
            client = make(True)
        if client.connected:
            try:
                self.resolve(client.geometry)
                self.check_group(client)
            except GeometryMismatch:
                client.close()
                raise
        return client

    def check_group(self, client):
        """Raises GeometryMismatch unless the daemon serves as many devices
        as the engine has tensor-parallel ranks."""
        size = client.group[1]
        if size != self.tp:
            raise GeometryMismatch(
                "%s refuses to start: the engine has %d tensor-parallel workers and kvshared "
                "serves %d device%s; start kvshared with %s and the geometry of one rank's KV "
                "heads" % (WHO, self.tp, size, "" if size == 1 else "s",
                           "--devices 0-%d" % (self.tp - 1) if self.tp > 1 else "one device"))

    def resolve(self, pool):
        """Checks the pool's layout (kvshare.Client.geometry) against the
        engine's; raises GeometryMismatch naming both."""
        check_geometry(pool, self.geometry, WHO)

    def scheduler_core(self):
        return SchedulerCore(self, self.connect(False, "vllm-scheduler", scheduler=True),
                             events=self.events_on)

    def check_one_node(self):
        """A group: raises GeometryMismatch unless every rank of the group
        shows up on this node within group_wait_s. Each rank's state file
        (where the scheduler learns what it mapped) is a local file, so a
        rank on another node would make every lookup miss, silently; and
        each rank must reach the kvshared on this node."""
        here = "%s.here" % self.worker_state_file()
        t0 = time.time()
        write_pools(here, [int(t0 * 1000)])
        wait = float(self.extra.get("group_wait_s", GROUP_WAIT_S))
        others = ["%s.here" % f for i, f in enumerate(self.state_files()) if i != self.rank]

        def missing():
            out = []
            for r, path in enumerate(self.state_files()):
                if r == self.rank:
                    continue
                seen = read_pools("%s.here" % path)
                if not any(t >= (t0 - wait) * 1000 for t in seen):  # older: another run's
                    out.append(r)
            return out
        gone = missing()
        while gone and time.time() - t0 < wait:
            time.sleep(0.05)
            gone = missing()
        if gone:
            raise GeometryMismatch(
                "%s refuses to start: tensor-parallel rank%s %s of this group did not show up "
                "on this node within %g s (rank %d waited for %s): a group whose ranks are on "
                "several nodes is not supported (each node has its own kvshared, and the "
                "scheduler learns what each rank mapped from files on its own node, so every "
                "lookup would miss); run the group on one node with kvshared --devices 0-%d, "
                "or without tensor parallelism across nodes"
                % (WHO, "s" if len(gone) > 1 else "", ", ".join(map(str, gone)), wait,
                   self.rank, ", ".join(others), self.tp - 1))


def _tensors(kv_caches):
    """The (num_blocks, page_bytes) tensors of vLLM's CanonicalKVCaches, or
    of a list of tensors (or of a dict layer name -> tensor)."""
    seq = getattr(kv_caches, "tensors", kv_caches)
    if isinstance(seq, dict):
        seq = list(seq.values())
    return [getattr(t, "tensor", t) for t in seq]


def _new_geometry(layers, dtype, block_tokens, kv_bytes, pool):
    """The engine's layout from what vLLM's OffloadingConfig says (layers,
    dtype, tokens per offloaded block, KV bytes per offloaded block) and the
    pool's heads and head size (the config does not name them): raises
    GeometryMismatch naming both layouts unless they agree."""
    geo = EngineGeometry(layers, pool["kv_heads"], pool["head_dim"], dtype, block_tokens)
    check_geometry(pool, geo, WHO)
    if 2 * layers * geo.slot_bytes != kv_bytes:
        raise GeometryMismatch(
            "%s refuses to start: the engine's KV layout (%d layers, %s, %d tokens per block, "
            "%d KV bytes per block) differs from the kvshared pool's (%s: %d bytes per block) "
            "in kv_heads x head_dim; start kvshared with the engine's geometry (--layers, "
            "--kv-heads, --head-dim, --dtype, --block-tokens) or point the plug-in at a daemon "
            "that has it" % (WHO, layers, geo.dtype, block_tokens, kv_bytes, geo.describe(),
                             2 * layers * geo.slot_bytes))
    return geo


# -- vLLM's classes: thin adapters over the cores, one per concept ---------------

def _event(keys, block_size):
    """vLLM's OffloadingEvent for keys now stored, with the fields this
    layout's class has (keys or block_hashes; the newest's Medium and
    Locality enums, or a medium name)."""
    fields = getattr(OffloadingEvent, "__dataclass_fields__", {})
    kw = {"keys" if "keys" in fields else "block_hashes": keys, "removed": False}
    medium = getattr(_base, "Medium", None)
    kw["medium"] = medium.CPU if medium is not None else MEDIUM
    if "block_size" in fields:
        kw["block_size"] = block_size
    if "locality" in fields and hasattr(_base, "Locality"):
        kw["locality"] = _base.Locality.LOCAL
    return OffloadingEvent(**kw)


def _store_output(todo, spec):
    """vLLM's PrepareStoreOutput, by this layout's field names."""
    if "keys_to_store" in getattr(PrepareStoreOutput, "__dataclass_fields__", {}):
        return PrepareStoreOutput(keys_to_store=todo, store_spec=spec, evicted_keys=[])
    return PrepareStoreOutput(block_hashes_to_store=todo, store_spec=spec,
                              block_hashes_evicted=[])


def _transfer_result(job, ok, size, t):
    """vLLM's TransferResult: a dataclass with the fields this layout has, or
    the abstract era's (job_id, success) tuple."""
    fields = getattr(TransferResult, "__dataclass_fields__", None)
    if not fields:
        return (job, ok)
    kw = {"job_id": job, "success": ok}
    if "transfer_size" in fields:
        kw.update(transfer_size=size, transfer_time=t)
    return TransferResult(**kw)


def _unnamed(*_args, **_kwargs):
    return None


class _Manager:
    """What every layout's manager does, over one SchedulerCore. Every
    entry point is guarded (keyblocks.guarded): a kvshare failure is a miss,
    a declined store or nothing, never an exception in vLLM's scheduler.
    owner: a request id (newest, base) or None (abstract: its lookup pins
    are shared, and expire after ttl without a prepare_load)."""

    def _init(self, core, block_size, ttl):
        self.core = core
        self.block_size = block_size
        self.ttl = ttl
        self.failures = Failures(WHO)

    def _expire(self):
        """Layouts without on_request_finished: drops lookup pins that no
        prepare_load took within ttl (once per call, not per key)."""
        if self.ttl is not None:
            self.core.expire(self.ttl)

    def _prepare_store(self, keys):
        self._expire()
        try:
            todo, ids, start = self.core.plan_store([bytes(k) for k in keys])
        except kvshare.KvsError:
            return None  # no daemon, or a group's blocks not allocated: vLLM skips it
        return _store_output(todo, KvshareLoadStoreSpec(todo, ids, start))

    def _events(self):
        return [_event(keys, self.block_size) for keys in self.core.take_stored()]

    @guarded(lambda self: [])
    def take_events(self):
        """Stored events (only with vLLM's KV events on: otherwise nothing is
        kept, and complete_store made no RPC to find them)."""
        return self._events()

    @guarded(_unnamed)
    def reset_cache(self):
        """Drops this namespace's blocks from kvshared that no one reads."""
        try:
            self.core.client.clear(self.core.keys.ns)
        except kvshare.KvsError:
            pass

    @guarded(_unnamed)
    def on_request_finished(self, req_context):
        self.core.release_owner(getattr(req_context, "req_id", None))


if KEYED:
    # newest: LookupResult; base: True / False (None would be "retry later").
    _HIT, _MISS = ((_base.LookupResult.HIT, _base.LookupResult.MISS) if LAYOUT == "newest"
                   else (True, False))

    class KvshareOffloadingManager(_Manager, OffloadingManager):
        """vLLM's OffloadingManager of the newest and the base-era layouts:
        one OffloadKey and a ReqContext per call."""

        def __init__(self, core, block_size=None, ttl=None):
            self._init(core, block_size, ttl)

        @guarded(lambda self, key, req_context: _MISS)
        def lookup(self, key, req_context):
            self._expire()
            return _HIT if self.core.lookup(req_context.req_id, bytes(key)) else _MISS

        @guarded(lambda self, keys, req_context: KvshareLoadStoreSpec(keys))
        def prepare_load(self, keys, req_context):
            return self.core.load_spec(req_context.req_id, [bytes(k) for k in keys],
                                       drop_rest=True)

        @guarded(_unnamed)
        def touch(self, keys, req_context):
            return None

        @guarded(_unnamed)
        def complete_load(self, keys, req_context):
            self.core.complete_load(req_context.req_id, [bytes(k) for k in keys])

        @guarded(lambda self, keys, req_context: None)
        def prepare_store(self, keys, req_context):
            return self._prepare_store(keys)

        @guarded(_unnamed)
        def complete_store(self, keys, req_context, success=True):
            self.core.complete_store([bytes(k) for k in keys], success)

        if hasattr(_base, "RequestOffloadingContext"):
            @guarded(lambda self, req_context: _base.RequestOffloadingContext())
            def on_new_request(self, req_context):
                return _base.RequestOffloadingContext()
else:
    class KvshareOffloadingManager(_Manager, OffloadingManager):
        """vLLM's OffloadingManager of the abstract era: block hashes, no
        request."""

        def __init__(self, core, block_size=None, ttl=None):
            self._init(core, block_size, ttl)

        @guarded(lambda self, block_hashes: 0)
        def lookup(self, block_hashes):
            self._expire()
            n = 0
            for h in block_hashes:
                if not self.core.lookup(None, bytes(h)):
                    break
                n += 1
            return n

        @guarded(lambda self, block_hashes: KvshareLoadStoreSpec(block_hashes))
        def prepare_load(self, block_hashes):
            return self.core.load_spec(None, [bytes(h) for h in block_hashes])

        @guarded(_unnamed)
        def touch(self, block_hashes):
            return None

        @guarded(_unnamed)
        def complete_load(self, block_hashes):
            self.core.complete_load(None, [bytes(h) for h in block_hashes])

        @guarded(lambda self, block_hashes: None)
        def prepare_store(self, block_hashes):
            return self._prepare_store(block_hashes)

        @guarded(_unnamed)
        def complete_store(self, block_hashes, success=True):
            self.core.complete_store([bytes(h) for h in block_hashes], success)


class _Transfers:
    """What the worker (newest) and the handlers (base, abstract) do over one
    WorkerCore; every entry point guarded: a submission is always accepted
    (vLLM asserts it), a result is never lost to an exception."""

    def _submit(self, job_id, load, src, dst):
        try:
            return self.core.submit(job_id, load, src, dst)
        except Exception as e:  # noqa: BLE001
            self.core.failures.note("submit", e)
            return self.core.submit_failed(job_id, load)

    def _finished(self, load=None):
        try:
            self.core.refresh(wait=False)  # notices a restarted daemon between transfers
        except Exception as e:  # noqa: BLE001
            self.core.failures.note("get_finished", e)
        return self.core.finished(load)

    @property
    def failures(self):
        return self.core.failures


if LAYOUT == "newest":
    class KvshareOffloadingWorker(_Transfers, OffloadingWorker):
        """vLLM's OffloadingWorker (vllm/v1/kv_offload/base.py, newest)."""

        def __init__(self, core):
            self.core = core

        def submit_store(self, job_id, src_spec, dst_spec):
            return self._submit(job_id, False, src_spec, dst_spec)

        def submit_load(self, job_id, src_spec, dst_spec):
            return self._submit(job_id, True, src_spec, dst_spec)

        @guarded(lambda self: [])
        def get_finished(self):
            return self._finished()

        @guarded(_unnamed)
        def wait(self, job_ids):
            self.core.wait(job_ids)

        @guarded(_unnamed)
        def shutdown(self):
            self.core.shutdown()
else:
    class KvshareOffloadingHandler(_Transfers, OffloadingHandler):
        """vLLM's OffloadingHandler (worker/worker.py of the base and
        abstract eras), one per direction over one worker core."""

        def __init__(self, core, load):
            self.core = core
            self.load = load

        def transfer_async(self, job_id, spec):
            src, dst = spec
            return self._submit(job_id, self.load, src, dst)

        @guarded(lambda self: [])
        def get_finished(self):
            return self._finished(self.load)

        @guarded(_unnamed)
        def wait(self, job_ids):
            self.core.wait(job_ids)

        @guarded(_unnamed)
        def shutdown(self):
            if self.load:
                self.core.shutdown()


class KvshareOffloadingSpec(OffloadingSpec, _SpecMixin):
    """Constructed by vLLM's OffloadingSpecFactory: spec_cls(config) (newest)
    or spec_cls(vllm_config, kv_cache_config) (base, abstract). Extra config
    keys: socket, namespace (default: one per model identity,
    "vllm-SLUG-HASH"; set one per tenant when tenants must not share),
    model_revision (declared with the model where vLLM's config names
    none), timeout_ms (default 1000), state_file (default in the temporary
    directory, named by engine and namespace), group_wait_s (tensor
    parallelism), block_size and lookup_pin_ttl_s (base, abstract). Refuses
    to start without a fixed PYTHONHASHSEED (check_hash_seed)."""

    if LAYOUT == "newest":
        def __init__(self, config):
            super().__init__(config)
            check_hash_seed()  # the newest OffloadingConfig names no hash algorithm
            groups = config.groups
            if len(groups) != 1:
                raise GeometryMismatch("%s: %d KV cache groups (a hybrid model); kvshared holds "
                                       "one uniform layout" % (WHO, len(groups)))
            factor = int(config.cache.blocks_per_chunk)
            self._layout = (len(groups[0].layer_names), config.model.dtype,
                            int(groups[0].tokens_per_block) * factor,
                            int(config.worker_kv_bytes_per_block) * factor)
            # Heads and head size come from the pool once seen (resolve).
            geo = EngineGeometry(self._layout[0], 0, 0, self._layout[1], self._layout[2])
            # OffloadingConfig.model names the model and the KV dtype, not its
            # revision: the extra config's model_revision where one is given.
            extra = config.extra_config
            model = {"model": getattr(config.model, "name", None),
                     "revision": extra.get("model_revision"), "dtype": config.model.dtype,
                     "layers": self._layout[0], "block_tokens": self._layout[2],
                     "kv_bytes": self._layout[3]}
            self.events_on = bool(getattr(config, "enable_kv_cache_events", False))
            self.offloaded_block_size_tokens = self._layout[2]
            self._setup(extra, config.engine_id, config.parallel.world_size, geo,
                        factor, config.parallel, model)
            probe = self.connect(False, "vllm-spec")  # refuses a wrong layout now
            probe.close()

        def resolve(self, pool):
            self.geometry = _new_geometry(*self._layout, pool)

        def get_worker(self, kv_caches):
            """Raises GeometryMismatch when the tensors' pages or the daemon's
            pool do not match the engine's layout, or (a group) when the
            group's ranks are not all on this node."""
            return KvshareOffloadingWorker(WorkerCore(self, _tensors(kv_caches),
                                                      _transfer_result))
    else:
        def __init__(self, vllm_config, kv_cache_config):
            super().__init__(vllm_config, kv_cache_config)
            cache = getattr(vllm_config, "cache_config", None)
            check_hash_seed(getattr(cache, "prefix_caching_hash_algo", None))
            groups = kv_cache_config.kv_cache_groups
            if len(groups) != 1:
                raise GeometryMismatch("%s: %d KV cache groups (a hybrid model); kvshared holds "
                                       "one uniform layout" % (WHO, len(groups)))
            spec = groups[0].kv_cache_spec
            gpu_block = int(spec.block_size)
            extra = self.extra_config
            # These releases set block_size_factor (no offloaded_block_size);
            # read vLLM's own extra-config key the same way.
            block = int(extra.get("block_size", gpu_block))
            if block % gpu_block:
                raise GeometryMismatch("%s: block_size %d is not a multiple of the GPU block "
                                       "size %d" % (WHO, block, gpu_block))
            geo = EngineGeometry(len(groups[0].layer_names), spec.num_kv_heads, spec.head_size,
                                 spec.dtype, block)
            parallel = getattr(vllm_config, "parallel_config", None)
            world = int(getattr(parallel, "world_size", 1) or 1)
            engine_id = getattr(vllm_config.kv_transfer_config, "engine_id", None)
            mc = getattr(vllm_config, "model_config", None)
            dtype = getattr(cache, "cache_dtype", None)
            if dtype in (None, "auto"):
                dtype = getattr(mc, "dtype", None) or spec.dtype
            model = {"model": getattr(mc, "model", None),
                     "revision": getattr(mc, "revision", None) or extra.get("model_revision"),
                     "tokenizer_revision": getattr(mc, "tokenizer_revision", None),
                     "dtype": str(dtype).replace("torch.", ""), "layers": geo.layers,
                     "kv_heads": geo.kv_heads, "head_dim": geo.head_dim,
                     "block_tokens": block}
            # vLLM's KV events (VllmConfig.kv_events_config): off by default.
            self.events_on = bool(getattr(getattr(vllm_config, "kv_events_config", None),
                                          "enable_kv_cache_events", False))
            self._setup(extra, engine_id, world, geo, block // gpu_block, model=model)
            self.offloaded_block_size_tokens = block

        def get_handlers(self, kv_caches, attn_backends=None):
            """(src spec type, dst spec type, handler) per direction; the
            abstract era also passes attn_backends (unused)."""
            core = WorkerCore(self, _tensors(kv_caches), _transfer_result)
            yield GPULoadStoreSpec, KvshareLoadStoreSpec, KvshareOffloadingHandler(core, False)
            yield KvshareLoadStoreSpec, GPULoadStoreSpec, KvshareOffloadingHandler(core, True)

    def get_manager(self):
        """Raises GeometryMismatch when the daemon's pool has another layout.
        Lookup pins of layouts without on_request_finished (abstract, base)
        expire after lookup_pin_ttl_s without a prepare_load."""
        ttl = None
        if LAYOUT != "newest" or not hasattr(OffloadingManager, "on_request_finished"):
            ttl = min(float(self.extra.get("lookup_pin_ttl_s", LOOKUP_PIN_TTL_S)),
                      KEEP_OLD_POOL_S)
        return KvshareOffloadingManager(self.scheduler_core(), self.offloaded_block_size_tokens,
                                        ttl)
