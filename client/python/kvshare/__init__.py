# SPDX-License-Identifier: Apache-2.0
"""kvshare: Python binding of libkvshare (ctypes, standard library only).

    import kvshare
    with kvshare.Client(socket_path="/run/kvshare/kvshared.sock") as c:
        hit = c.lookup(tokens, pin=True)          # block ids of the cached prefix
        new = c.alloc(len(tokens) // c.geometry["block_tokens"] - len(hit))
        c.block_view(layer, 0, new[0])[:] = k_bytes   # host backend: write K
        canonical = c.commit(tokens, hit + new)
        c.release(canonical)

Prefixes in flight: a worker that may compute a prompt another worker is
computing right now waits for it instead (kvs_lookup_wait, kvs_alloc_for):

        hit = c.lookup(tokens, ns="chat", wait_ms=2000)   # waits for others' writes
        new = c.alloc(n - len(hit), ns="chat", tokens=tokens, first_block=len(hit))
        ...                                               # compute, write
        c.commit(tokens, hit + new, ns="chat")            # waiters get them now
        ids, in_flight = c.lookup_inflight(tokens, ns="chat")   # no wait: how many
                                                          # blocks others are writing

Retention hints (kvs_commit_hint, kvs_pin_hint, kvs_release_hint): a
priority 0-100 (lowest evicted first; default 50) and an optional duration:

        c.commit(tokens, ids, ns="chat", priority=90)             # a system prompt
        c.release(ids, priority=70, duration_ms=600_000)          # the user may be back
        c.release(ids, priority=0, duration_ms=60_000)            # the chat was closed

A block's priority is the highest live hint; priority is never a pin. A
hint names the blocks the call handles: commit() the canonical blocks it
commits, pin() those it pins, release() the cached ones it releases; to
give the blocks of one request different priorities, release them in one
call per priority. stats() shows per namespace the blocks cached and
evicted by priority band ("cached_by_priority", "evicted_by_priority":
{"0-24": n, "25-49": n, "50-74": n, "75-100": n}).

Same calls as kvshare.h. Errors raise KvsError (status, message). The cache
is an optimisation: while the daemon is unreachable, lookup() returns []
(a miss) instead of raising; every call first tries to reconnect.

The library is found through $KVSHARE_LIB, then next to this package or in a
build tree, then on the system's library path (libkvshare.so.1).

Submodules (imported on demand; they need PyTorch, the binding does not):
kvshare.tensors (PyTorch tensors over pool memory, block copies),
kvshare.keyblocks (blocks named by an engine's key, the geometry check),
kvshare.vllm (vLLM's offloading connector) and kvshare.sglang (SGLang's
HiCache storage), which also need their engine (they derive from its
classes); docs/ENGINES.md says how to configure each engine.
"""

import array
import ctypes
import ctypes.util
import os
import time

__all__ = ["Client", "Identity", "KvsError", "counter_names", "load_library", "STATUS"]

# The status table of kvshare_status.h (name -> code); kept in step by the
# binding's test, which compares it with kvs_strerror for every code.
STATUS = {
    "OK": 0, "EINVAL": -1, "ENOMEM": -2, "EPOOLFULL": -3, "EQUOTA": -4,
    "ENOTFOUND": -5, "ENOTPINNED": -6, "ENOTHELD": -7, "EBADSTATE": -8,
    "ENONS": -9, "EEXIST": -10, "EPROTO": -11, "ETOOBIG": -12,
    "ETIMEDOUT": -13, "ENOTCONN": -14, "EIO": -15, "ENODRIVER": -16,
    "ENODEV": -17, "ENOTSUP": -18, "ELIMIT": -19, "EDENIED": -20,
    "EVERSION": -21, "EBUSY": -22, "EINTERNAL": -23, "EIDENTITY": -24,
}
_NAMES = {v: k for k, v in STATUS.items()}

# KVS_SOVERSION of kvshare_version.h: the structures below are that ABI's.
_SOVERSION = 1

KVS_NO_MAP = 0x1
KVS_LAZY = 0x2
KVS_MAP_TIER2 = 0x4
KVS_RANK = 0x8
KVS_GROUP_SCHEDULER = 0x10
KVS_BREAKER = 0x20
BACKEND_HOST = 1
BACKEND_CUDA = 2


class KvsError(Exception):
    """A failed call: .status is the negative KVS_* code, .name its name."""

    def __init__(self, status, message):
        self.status = status
        self.name = "KVS_" + _NAMES.get(status, str(status))
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


class _Identity(ctypes.Structure):
    """kvs_identity_t: whose KV a client reads and writes (kvshare.h, "Model
    identity")."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("ns", ctypes.c_char_p), ("model", ctypes.c_char_p),
        ("revision", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
        ("layers", ctypes.c_uint32), ("kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32), ("block_tokens", ctypes.c_uint32),
        ("kv_lora_rank", ctypes.c_uint32), ("rope_head_dim", ctypes.c_uint32),
        ("tp_size", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 4),
    ]


class _Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("socket_path", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("worker_name", ctypes.c_char_p),
        ("flags", ctypes.c_uint),
        ("reconnect_ms", ctypes.c_int),
        ("daemon_uid", ctypes.c_uint64),
        ("rank", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("identity", ctypes.POINTER(_Identity)),
        ("reserved", ctypes.c_uint64 * 5),
    ]


class _BreakerStats(ctypes.Structure):
    """kvs_breaker_stats_t: the client's circuit breaker (kvshare.h,
    "Circuit breaker")."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("state", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("trips", ctypes.c_uint64), ("probes", ctypes.c_uint64),
        ("fast_fails", ctypes.c_uint64), ("down_ms", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 6),
    ]


class Identity:
    """A model identity to declare in Hello (kvs_identity_t): model (its
    name or path, required), revision, dtype ("fp32", "fp16", "bf16",
    "fp8"), the geometry one block holds (layers, kv_heads, head_dim,
    block_tokens; MLA: kv_lora_rank, rope_head_dim) and tp_size (the
    devices one block spans); ns: the namespace it is declared for (None:
    "default"). None or 0: not declared (the pool's stands). kvshared binds
    a namespace that holds nothing of another model to it, and refuses a
    namespace that does with KVS_EIDENTITY."""

    STRINGS = ("ns", "model", "revision", "dtype")
    NUMBERS = ("layers", "kv_heads", "head_dim", "block_tokens", "kv_lora_rank",
               "rope_head_dim", "tp_size")

    def __init__(self, model, ns=None, revision=None, dtype=None, layers=0, kv_heads=0,
                 head_dim=0, block_tokens=0, kv_lora_rank=0, rope_head_dim=0, tp_size=0):
        if not model:
            raise ValueError("a model identity needs the model's name or path")
        self.model, self.ns, self.revision, self.dtype = str(model), ns, revision, dtype
        self.layers, self.kv_heads, self.head_dim = int(layers or 0), int(kv_heads or 0), \
            int(head_dim or 0)
        self.block_tokens = int(block_tokens or 0)
        self.kv_lora_rank, self.rope_head_dim = int(kv_lora_rank or 0), int(rope_head_dim or 0)
        self.tp_size = int(tp_size or 0)

    @classmethod
    def of(cls, value):
        """An Identity from an Identity or a dict of its fields (TypeError
        for a field it does not have)."""
        if isinstance(value, cls):
            return value
        return cls(**dict(value))

    def as_dict(self):
        return {f: getattr(self, f) for f in self.STRINGS + self.NUMBERS}

    def __eq__(self, other):
        return isinstance(other, Identity) and self.as_dict() == other.as_dict()

    def __repr__(self):
        return "Identity(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items()
                                          if kv[1] not in (None, 0))

    def _struct(self, lib):
        """(kvs_identity_t, the encoded strings it points to: keep both)."""
        s = _Identity()
        lib.kvs_identity_init(ctypes.byref(s))
        keep = tuple(_enc(getattr(self, f)) for f in self.STRINGS)
        for f, b in zip(self.STRINGS, keep):
            setattr(s, f, b)
        for f in self.NUMBERS:
            setattr(s, f, getattr(self, f))
        return s, keep


class _Geometry(ctypes.Structure):
    _fields_ = [
        ("layers", ctypes.c_uint32), ("kv_heads", ctypes.c_uint32),
        ("head_dim", ctypes.c_uint32), ("dtype_bytes", ctypes.c_uint32),
        ("dtype", ctypes.c_char * 8),
        ("block_tokens", ctypes.c_uint32), ("num_blocks", ctypes.c_uint32),
        ("block_bytes", ctypes.c_uint64), ("slot_bytes", ctypes.c_uint64),
        ("layer_stride", ctypes.c_uint64), ("kv_stride", ctypes.c_uint64),
        ("block_stride", ctypes.c_uint64), ("pool_bytes", ctypes.c_uint64),
        ("backend", ctypes.c_int),
        ("device_uuid", ctypes.c_uint8 * 16),
        ("kv_lora_rank", ctypes.c_uint32), ("rope_head_dim", ctypes.c_uint32),
        ("tier2_blocks", ctypes.c_uint32), ("tier2_bytes", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 6),
    ]


# KVS_PRIORITY_BANDS: retention priorities 0-24, 25-49, 50-74, 75-100.
PRIORITY_BANDS = ("0-24", "25-49", "50-74", "75-100")


class _PriorityBands(ctypes.Structure):
    _fields_ = [
        ("cached", ctypes.c_uint64 * len(PRIORITY_BANDS)),
        ("evicted", ctypes.c_uint64 * len(PRIORITY_BANDS)),
        ("reserved", ctypes.c_uint64 * 4),
    ]


class _NsStats(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 64),
        ("lookups", ctypes.c_uint64), ("lookup_tokens", ctypes.c_uint64),
        ("hit_tokens", ctypes.c_uint64), ("inserted_blocks", ctypes.c_uint64),
        ("duplicate_blocks", ctypes.c_uint64), ("evicted_blocks", ctypes.c_uint64),
        ("cached_blocks", ctypes.c_uint32), ("pinned_blocks", ctypes.c_uint32),
        ("quota", ctypes.c_uint32), ("reserve", ctypes.c_uint32),
        ("evicted_own", ctypes.c_uint64), ("evicted_others", ctypes.c_uint64),
        ("evicted_quota", ctypes.c_uint64),
        ("bands", ctypes.POINTER(_PriorityBands)),
        ("tier2_blocks", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("tier2_hit_tokens", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


# KVS_COUNTER_SLOTS of kvshare_counters.h: the room kvs_stats_t keeps for
# counters. The counters' names come from the library (kvs_counter_name),
# so this binding never lists them.
COUNTER_SLOTS = 64


class _DeviceStats(ctypes.Structure):
    _fields_ = [
        ("rank", ctypes.c_uint32), ("ordinal", ctypes.c_int32),
        ("detail", ctypes.c_char * 160),
        ("pool_bytes", ctypes.c_uint64), ("used_bytes", ctypes.c_uint64),
        ("workers", ctypes.c_uint32),
        ("shards_written", ctypes.c_uint32), ("shards_missing", ctypes.c_uint32),
        ("reserved32", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 4),
    ]


class _ClusterNode(ctypes.Structure):
    _fields_ = [
        ("address", ctypes.c_char * 80), ("state", ctypes.c_char * 16),
        ("slots", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("requests", ctypes.c_uint64), ("errors", ctypes.c_uint64),
        ("replies", ctypes.c_uint64), ("latency_us_sum", ctypes.c_uint64),
        ("latency_us_max", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64 * 2),
    ]


class _RestoreStatus(ctypes.Structure):
    _fields_ = [("phase", ctypes.c_char * 16)] + [
        (name, ctypes.c_uint64)
        for name in ("slots", "scanned", "records", "restored", "dropped", "elapsed_ms")
    ] + [("reserved", ctypes.c_uint64 * 4)]


class _Stats(ctypes.Structure):
    _fields_ = [
        ("total_blocks", ctypes.c_uint32), ("free_blocks", ctypes.c_uint32),
        ("writing_blocks", ctypes.c_uint32), ("cached_blocks", ctypes.c_uint32),
        ("pinned_blocks", ctypes.c_uint32),
        ("sessions", ctypes.c_uint32),
        ("block_tokens", ctypes.c_uint32),
        ("backend", ctypes.c_int),
        ("block_bytes", ctypes.c_uint64), ("pool_bytes", ctypes.c_uint64),
        ("index_bytes", ctypes.c_uint64),
        ("uptime_ms", ctypes.c_uint64),
        ("n_namespaces", ctypes.c_size_t),
        ("namespaces", ctypes.POINTER(_NsStats)),
        ("tier2_total_blocks", ctypes.c_uint32), ("tier2_cached_blocks", ctypes.c_uint32),
        ("copying_blocks", ctypes.c_uint32), ("loop_busy_max_us", ctypes.c_uint32),
        ("copy_path", ctypes.c_char_p),
        ("n_devices", ctypes.c_uint32), ("n_cluster_nodes", ctypes.c_uint32),
        ("devices", ctypes.POINTER(_DeviceStats)),
        ("cluster_nodes", ctypes.POINTER(_ClusterNode)),
        ("tier3_total_blocks", ctypes.c_uint32), ("tier3_cached_blocks", ctypes.c_uint32),
        ("disk_io", ctypes.c_char_p),
        ("counters", ctypes.c_uint64 * COUNTER_SLOTS),
    ]


class _EvictResult(ctypes.Structure):
    _fields_ = [
        ("tier1_blocks", ctypes.c_uint32), ("tier2_blocks", ctypes.c_uint32),
        ("kept_blocks", ctypes.c_uint32), ("reserved32", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 3),
    ]


class _Prefix(ctypes.Structure):
    _fields_ = [
        ("ns", ctypes.c_char * 64),
        ("tokens", ctypes.c_uint32), ("blocks", ctypes.c_uint32),
        ("pins", ctypes.c_uint32),
        ("hits", ctypes.c_uint64), ("age_ticks", ctypes.c_uint64),
        ("last_block_id", ctypes.c_uint32),
        ("tier", ctypes.c_uint32), ("tier2_blocks", ctypes.c_uint32),
        ("parent_block_id", ctypes.c_uint32), ("has_parent", ctypes.c_uint32),
        ("reserved", ctypes.c_uint64 * 2),
    ]


_lib = None


def load_library(path=None):
    """Loads libkvshare once; path overrides the search."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    candidates = []
    if path:
        candidates.append(path)
    if os.environ.get("KVSHARE_LIB"):
        candidates.append(os.environ["KVSHARE_LIB"])
    here = os.path.dirname(os.path.abspath(__file__))
    candidates += [
        os.path.join(here, "libkvshare.so"),
        os.path.join(here, "..", "..", "..", "build", "client", "libkvshare.so"),
    ]
    # The library path: dlopen's own search by soname (LD_LIBRARY_PATH, the
    # ld.so cache: /usr/lib/<triplet>/libkvshare.so.1 from the Debian
    # package libkvshare1), then ctypes' search, which also finds the
    # development symlink libkvshare.so.
    candidates.append("libkvshare.so.%d" % _SOVERSION)
    found = ctypes.util.find_library("kvshare")
    if found:
        candidates.append(found)
    errors = []
    for cand in candidates:
        try:
            lib = ctypes.CDLL(cand)
            break
        except OSError as e:
            errors.append(str(e))
    else:
        raise OSError("libkvshare not found (set KVSHARE_LIB): " + "; ".join(errors))
    _declare(lib)
    _check_sizes(lib)
    _lib = lib
    return lib


def _check_sizes(lib):
    """The option structs this binding fills must be the library's size
    (their _init sets .size to the C sizeof): raises OSError otherwise,
    before a call could write past a struct or read a field at the wrong
    offset."""
    for name, cls in (("kvs_options_init", _Options), ("kvs_identity_init", _Identity),
                      ("kvs_commit_opts_init", _CommitOpts),
                      ("kvs_breaker_stats_init", _BreakerStats)):
        room = (ctypes.c_uint8 * 4096)()  # larger than any of them: init may write it all
        getattr(lib, name)(ctypes.cast(room, ctypes.POINTER(cls)))
        size = ctypes.c_size_t.from_buffer(room).value
        if size != ctypes.sizeof(cls):
            raise OSError("libkvshare's %s fills %d bytes, this binding's mirror has %d: "
                          "a binding and a library of different releases"
                          % (name, size, ctypes.sizeof(cls)))


def _declare(lib):
    P, U32P, SZ = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t
    SZP = ctypes.POINTER(ctypes.c_size_t)
    sig = {
        "kvs_strerror": (ctypes.c_char_p, [ctypes.c_int]),
        "kvs_options_init": (None, [ctypes.POINTER(_Options)]),
        "kvs_identity_init": (None, [ctypes.POINTER(_Identity)]),
        "kvs_identity": (ctypes.c_int, [P, ctypes.c_void_p, SZ,
                                        ctypes.POINTER(ctypes.c_uint64)]),
        "kvs_connect": (ctypes.c_int, [ctypes.POINTER(_Options), ctypes.POINTER(P)]),
        "kvs_close": (None, [P]),
        "kvs_connected": (ctypes.c_int, [P]),
        "kvs_epoch": (ctypes.c_uint64, [P]),
        "kvs_breaker_stats_init": (None, [ctypes.POINTER(_BreakerStats)]),
        "kvs_breaker": (ctypes.c_int, [P, ctypes.POINTER(_BreakerStats)]),
        "kvs_group": (ctypes.c_int, [P, ctypes.POINTER(ctypes.c_uint32),
                                     ctypes.POINTER(ctypes.c_uint32)]),
        "kvs_last_error": (ctypes.c_char_p, [P]),
        "kvs_set_timeout": (None, [P, ctypes.c_int]),
        "kvs_geometry": (ctypes.c_int, [P, ctypes.POINTER(_Geometry)]),
        "kvs_pool_base": (ctypes.c_size_t, [P]),
        "kvs_block_addr": (ctypes.c_int, [P, ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.c_uint32, ctypes.POINTER(ctypes.c_size_t)]),
        "kvs_block_write": (ctypes.c_int, [P, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                           ctypes.c_char_p, SZ]),
        "kvs_block_read": (ctypes.c_int, [P, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32,
                                          ctypes.c_void_p, SZ]),
        "kvs_lookup": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, ctypes.c_int,
                                      U32P, SZ, SZP]),
        "kvs_alloc": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_uint32, U32P]),
        "kvs_lookup_wait": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, ctypes.c_int,
                                           ctypes.c_uint32, U32P, SZ, SZP,
                                           ctypes.POINTER(ctypes.c_uint32),
                                           ctypes.POINTER(ctypes.c_int)]),
        "kvs_alloc_for": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, ctypes.c_uint32,
                                         ctypes.c_uint32, U32P]),
        "kvs_commit_hint": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, U32P, SZ, U32P, SZP,
                                           ctypes.POINTER(_Hint)]),
        "kvs_commit_opts_init": (None, [ctypes.POINTER(_CommitOpts)]),
        "kvs_commit_ex": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, U32P, SZ,
                                         ctypes.POINTER(_CommitOpts), U32P, SZP]),
        "kvs_pin_hint": (ctypes.c_int, [P, U32P, SZ, SZP, ctypes.POINTER(_Hint)]),
        "kvs_release_hint": (ctypes.c_int, [P, U32P, SZ, SZP, ctypes.POINTER(_Hint)]),
        "kvs_commit": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, U32P, SZ, U32P, SZP]),
        "kvs_pin": (ctypes.c_int, [P, U32P, SZ, SZP]),
        "kvs_release": (ctypes.c_int, [P, U32P, SZ, SZP]),
        "kvs_stats": (ctypes.c_int, [P, ctypes.POINTER(_Stats)]),
        "kvs_stats_free": (None, [ctypes.POINTER(_Stats)]),
        "kvs_counter_name": (ctypes.c_char_p, [SZ]),
        "kvs_tree": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int,
                                    ctypes.POINTER(_Prefix), SZ, SZP]),
        "kvs_ping": (ctypes.c_int, [P, SZ, ctypes.POINTER(ctypes.c_double)]),
        "kvs_restore_status": (ctypes.c_int, [P, ctypes.POINTER(_RestoreStatus)]),
        "kvs_clear": (ctypes.c_int, [P, ctypes.c_char_p, SZP, SZP]),
        "kvs_evict": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ,
                                     ctypes.POINTER(_EvictResult)]),
        "kvs_alloc_report": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_uint32, U32P, U32P,
                                            SZ, SZP]),
        "kvs_tier2_base": (ctypes.c_size_t, [P]),
        "kvs_tier2_block_addr": (ctypes.c_int, [P, ctypes.c_uint32, ctypes.c_uint32,
                                                ctypes.c_uint32, ctypes.POINTER(ctypes.c_size_t)]),
        "kvs_tier2_block_read": (ctypes.c_int, [P, ctypes.c_uint32, ctypes.c_uint32,
                                                ctypes.c_uint32, ctypes.c_void_p, SZ]),
        "kvs_lookup_tier2": (ctypes.c_int, [P, ctypes.c_char_p, U32P, SZ, U32P,
                                            ctypes.POINTER(ctypes.c_uint8), SZ, SZP]),
        "kvs_release_tiers": (ctypes.c_int, [P, U32P, ctypes.POINTER(ctypes.c_uint8), SZ,
                                             SZP]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def counter_names(lib=None):
    """The daemon counters this library knows, in kvs_stats_t order."""
    lib = lib or load_library()
    names = []
    while True:
        name = lib.kvs_counter_name(len(names))
        if name is None:
            return names
        names.append(name.decode())


class _Hint(ctypes.Structure):
    _fields_ = [("priority", ctypes.c_uint32), ("duration_ms", ctypes.c_uint32)]


class _CommitOpts(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("hint", ctypes.POINTER(_Hint)),
                ("for_group", ctypes.c_uint32), ("shard_written", ctypes.c_uint32),
                ("n_pending", ctypes.POINTER(ctypes.c_size_t)),
                ("reserved", ctypes.c_uint64 * 4)]


def _hint(priority, duration_ms):
    """A kvs_hint_t pointer, or None (no hint) when priority is None."""
    if priority is None:
        return None
    return ctypes.pointer(_Hint(priority, duration_ms))


def _u32(values):
    """(ctypes pointer, count, keep-alive) for a sequence of uint32."""
    arr = values if isinstance(values, array.array) and values.typecode == "I" \
        else array.array("I", values)
    if len(arr) == 0:
        return None, 0, arr
    ptr = (ctypes.c_uint32 * len(arr)).from_buffer(arr)
    return ptr, len(arr), arr


def _enc(s):
    return None if s is None else s.encode()


class Client:
    """One connection to kvshared (a session): see kvshare.h for the semantics."""

    def __init__(self, socket_path=None, timeout_ms=1000, worker_name=None,
                 map_pool=True, lazy=False, reconnect_ms=0, lib=None, daemon_uid=0,
                 map_tier2=False, rank=None, group_scheduler=False, identity=None,
                 breaker=False):
        """rank: this worker's rank (device) on a kvshared with several
        devices (--devices); group_scheduler: the group's scheduler (maps
        nothing). See kvshare.h, KVS_RANK. identity: the model identity
        declared in Hello (an Identity, or a dict of its fields); a
        namespace that holds another model's KV refuses the connection
        with KVS_EIDENTITY (lazy: the client stays disconnected, every
        call fails so, last_error names both identities). breaker: the
        circuit breaker (KVS_BREAKER): once a call finds the daemon hung or
        gone, every call fails at once (KvsError KVS_ENOTCONN; lookup a
        miss) until a background probe gets an answer; see breaker()."""
        self._c = None
        self._lib = load_library(lib)
        opts = _Options()
        self._lib.kvs_options_init(ctypes.byref(opts))
        self._keep = (_enc(socket_path), _enc(worker_name))
        opts.socket_path = self._keep[0]
        opts.worker_name = self._keep[1]
        self.declared = None
        if identity is not None:
            self.declared = Identity.of(identity)
            # The library copies it; kept all the same for the client's life.
            self._ident = self.declared._struct(self._lib)
            opts.identity = ctypes.pointer(self._ident[0])
        opts.timeout_ms = int(timeout_ms)
        opts.reconnect_ms = int(reconnect_ms)
        opts.daemon_uid = int(daemon_uid)
        opts.flags = ((0 if map_pool else KVS_NO_MAP) | (KVS_LAZY if lazy else 0) |
                      (KVS_MAP_TIER2 if map_tier2 else 0) |
                      (KVS_RANK if rank is not None else 0) |
                      (KVS_GROUP_SCHEDULER if group_scheduler else 0) |
                      (KVS_BREAKER if breaker else 0))
        opts.rank = int(rank or 0)
        handle = ctypes.c_void_p()
        rc = self._lib.kvs_connect(ctypes.byref(opts), ctypes.byref(handle))
        if rc != 0:
            raise KvsError(rc, self._refusal(opts, rc))
        self._c = handle

    def _refusal(self, opts, rc):
        """Why kvs_connect failed: a failed connect frees its client, and
        with it the daemon's message, so a refusal for another model's
        identity, whose message names both, is asked once more by a lazy
        client, whose last_error keeps it."""
        why = self._lib.kvs_strerror(rc).decode()
        if rc != STATUS["EIDENTITY"]:
            return why  # the code says it all; asking again would count twice
        opts.flags |= KVS_LAZY | KVS_NO_MAP
        handle = ctypes.c_void_p()
        if self._lib.kvs_connect(ctypes.byref(opts), ctypes.byref(handle)) == 0:
            again = self._lib.kvs_last_error(handle)
            if not self._lib.kvs_connected(handle) and again:
                why = again.decode(errors="replace")
            self._lib.kvs_close(handle)
        return why

    # -- lifetime --
    def close(self):
        if self._c:
            self._lib.kvs_close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _check(self, rc):
        if rc != 0:
            raise KvsError(rc, self.last_error or self._lib.kvs_strerror(rc).decode())

    @property
    def connected(self):
        return bool(self._lib.kvs_connected(self._c))

    @property
    def epoch(self):
        return self._lib.kvs_epoch(self._c)

    def breaker(self):
        """The circuit breaker (kvs_breaker): {"state": "up" or "down",
        "trips", "probes", "fast_fails", "down_ms"}; all 0 and "up" for a
        client made without breaker=True. Safe from any thread while the
        client is open."""
        s = _BreakerStats()
        self._lib.kvs_breaker_stats_init(ctypes.byref(s))
        self._check(self._lib.kvs_breaker(self._c, ctypes.byref(s)))
        out = {name: getattr(s, name) for name, _ in _BreakerStats._fields_
               if name not in ("size", "reserved32", "reserved")}
        out["state"] = "down" if s.state == 1 else "up"
        return out

    @property
    def last_error(self):
        return self._lib.kvs_last_error(self._c).decode(errors="replace")

    def identity(self):
        """(canonical text, 64-bit hash) of the identity kvshared holds for
        the namespace this client declared one for (Client(identity=...)),
        as its last Hello said. Raises KvsError: ENOTFOUND (nothing
        declared, or a daemon that says none), ENOTCONN (never connected)."""
        buf = ctypes.create_string_buffer(1024)
        h = ctypes.c_uint64()
        self._check(self._lib.kvs_identity(self._c, buf, len(buf), ctypes.byref(h)))
        return buf.value.decode(errors="replace"), h.value

    def set_timeout(self, timeout_ms):
        self._lib.kvs_set_timeout(self._c, int(timeout_ms))

    # -- geometry and memory --
    @property
    def group(self):
        """(rank, group size): this client's rank and the daemon's devices."""
        rank, size = ctypes.c_uint32(), ctypes.c_uint32()
        self._check(self._lib.kvs_group(self._c, ctypes.byref(rank), ctypes.byref(size)))
        return rank.value, size.value

    @property
    def geometry(self):
        g = _Geometry()
        self._check(self._lib.kvs_geometry(self._c, ctypes.byref(g)))
        return {
            "layers": g.layers, "kv_heads": g.kv_heads, "head_dim": g.head_dim,
            "dtype": g.dtype.decode(), "dtype_bytes": g.dtype_bytes,
            "block_tokens": g.block_tokens, "num_blocks": g.num_blocks,
            "block_bytes": g.block_bytes, "slot_bytes": g.slot_bytes,
            "layer_stride": g.layer_stride, "kv_stride": g.kv_stride,
            "block_stride": g.block_stride, "pool_bytes": g.pool_bytes,
            "backend": "cuda" if g.backend == BACKEND_CUDA else "host",
            "device_uuid": bytes(g.device_uuid),
            "kv_lora_rank": g.kv_lora_rank, "rope_head_dim": g.rope_head_dim,
            "tier2_blocks": g.tier2_blocks, "tier2_bytes": g.tier2_bytes,
        }

    @property
    def pool_base(self):
        return self._lib.kvs_pool_base(self._c)

    def block_addr(self, layer, kv, block):
        """Address of block's K (kv=0) or V (kv=1) in layer: slot_bytes contiguous bytes."""
        addr = ctypes.c_size_t()
        self._check(self._lib.kvs_block_addr(self._c, layer, kv, block, ctypes.byref(addr)))
        return addr.value

    def block_view(self, layer, kv, block):
        """A writable memoryview over one block's K or V slot (host backend only:
        a cuda pool's addresses are device pointers)."""
        geo = self.geometry
        if geo["backend"] != "host":
            raise KvsError(STATUS["ENOTSUP"], "block_view needs the host backend; "
                           "use block_addr with your device library for cuda")
        addr = self.block_addr(layer, kv, block)
        buf = (ctypes.c_uint8 * geo["slot_bytes"]).from_address(addr)
        return memoryview(buf).cast("B")

    def block_write(self, layer, kv, block, data):
        """Copies bytes to the start of a block's K or V slot (host or cuda)."""
        data = bytes(data)
        self._check(self._lib.kvs_block_write(self._c, layer, kv, block, data, len(data)))

    def block_read(self, layer, kv, block, n=None):
        """Bytes from the start of a block's K or V slot (default: the whole slot)."""
        if n is None:
            n = self.geometry["slot_bytes"]
        buf = ctypes.create_string_buffer(n)
        self._check(self._lib.kvs_block_read(self._c, layer, kv, block, buf, n))
        return buf.raw

    # -- tier 2 in place (Client(map_tier2=True); kvshare.h "Tier 2 in place") --
    @property
    def tier2_base(self):
        """Address of the read-only tier-2 mapping (host memory); 0 when not mapped."""
        return self._lib.kvs_tier2_base(self._c)

    def tier2_block_addr(self, layer, kv, block):
        """Address of tier-2 block's K (kv=0) or V (kv=1) in layer: slot_bytes
        bytes to read, never to write, while this client pins the block."""
        addr = ctypes.c_size_t()
        self._check(self._lib.kvs_tier2_block_addr(self._c, layer, kv, block,
                                                   ctypes.byref(addr)))
        return addr.value

    def tier2_block_read(self, layer, kv, block, n=None):
        """Bytes from the start of a tier-2 block's K or V slot (default: all of it)."""
        if n is None:
            n = self.geometry["slot_bytes"]
        buf = ctypes.create_string_buffer(n)
        self._check(self._lib.kvs_tier2_block_read(self._c, layer, kv, block, buf, n))
        return buf.raw

    def lookup_tier2(self, tokens, ns=None):
        """The longest cached prefix, pinned, as (tier, block id) pairs: tier 1
        blocks are in the pool, tier 2 blocks stay in tier 2 (ids in tier 2)
        for this client to read itself. Release with release_tiers(). []
        while the daemon is unreachable."""
        ptr, n, keep = _u32(tokens)
        ids = (ctypes.c_uint32 * max(1, n))()
        tiers = (ctypes.c_uint8 * max(1, n))()
        got = ctypes.c_size_t()
        rc = self._lib.kvs_lookup_tier2(self._c, _enc(ns), ptr, n, ids, tiers, n,
                                        ctypes.byref(got))
        del keep
        if rc in (STATUS["ENOTCONN"], STATUS["ETIMEDOUT"]):
            return []
        self._check(rc)
        return [(tiers[i], ids[i]) for i in range(got.value)]

    def release_tiers(self, blocks):
        """Releases what lookup_tier2 returned ((tier, id) pairs, pool blocks
        first); returns how many."""
        blocks = list(blocks)
        p, n, keep = _u32([b for _, b in blocks])
        tiers = (ctypes.c_uint8 * max(1, n))(*[t for t, _ in blocks])
        done = ctypes.c_size_t()
        self._check(self._lib.kvs_release_tiers(self._c, p, tiers, n, ctypes.byref(done)))
        return done.value

    # -- RPCs --
    def lookup_inflight(self, tokens, ns=None, pin=True, wait_ms=0):
        """(block ids of the longest cached prefix, blocks after it that other
        clients are writing now). wait_ms > 0: wait up to that long for
        those blocks (see the module doc). ([], 0) while the daemon is
        unreachable."""
        ptr, n, keep = _u32(tokens)
        # At most one id per token: no geometry needed to size the answer.
        out = (ctypes.c_uint32 * max(1, n))()
        got = ctypes.c_size_t()
        inflight = ctypes.c_uint32()
        waited = ctypes.c_int()
        rc = self._lib.kvs_lookup_wait(self._c, _enc(ns), ptr, n, 1 if pin else 0, wait_ms, out,
                                       n, ctypes.byref(got), ctypes.byref(inflight),
                                       ctypes.byref(waited))
        del keep
        if rc in (STATUS["ENOTCONN"], STATUS["ETIMEDOUT"]):
            return [], 0
        self._check(rc)
        return list(out[:got.value]), inflight.value

    def lookup(self, tokens, ns=None, pin=True, wait_ms=0):
        """Block ids of the longest cached prefix; [] on a miss or while the
        daemon is unreachable (then last_error says why). wait_ms > 0: wait
        up to that long for blocks other clients are writing."""
        return self.lookup_inflight(tokens, ns, pin, wait_ms)[0]

    def alloc(self, n, ns=None, tokens=None, first_block=0):
        """n WRITING blocks. With tokens (and ns): declared as holding blocks
        first_block .. first_block + n - 1 of them, so that others wait."""
        out = (ctypes.c_uint32 * n)()
        if tokens is None:
            self._check(self._lib.kvs_alloc(self._c, _enc(ns), n, out))
        else:
            tp, tn, keep = _u32(tokens)
            self._check(self._lib.kvs_alloc_for(self._c, _enc(ns), tp, tn, first_block, n, out))
            del keep
        return list(out)

    def alloc_report(self, n, ns):
        """n WRITING blocks in namespace ns, and the blocks of ns this Alloc
        evicted to make room: (ids, [token ids of each evicted block])."""
        out = (ctypes.c_uint32 * n)()
        bt = self.geometry["block_tokens"]
        evicted = (ctypes.c_uint32 * (n * bt))()
        got = ctypes.c_size_t()
        self._check(self._lib.kvs_alloc_report(self._c, _enc(ns), n, out, evicted, n,
                                               ctypes.byref(got)))
        return list(out), [list(evicted[i * bt:(i + 1) * bt]) for i in range(got.value)]

    def clear(self, ns=None):
        """Drops namespace ns's cached blocks that no client pins (but the
        prefixes of pinned ones); returns (blocks dropped, cached blocks
        kept). Raises KvsError (ENONS, EDENIED, ENOTCONN, ...)."""
        cleared, kept = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.kvs_clear(self._c, _enc(ns), ctypes.byref(cleared),
                                        ctypes.byref(kept)))
        return cleared.value, kept.value

    def evict(self, tokens, ns=None):
        """Drops the prompt's cached blocks that nothing else needs, from
        every tier: from its end backward, each block no client pins and no
        other cached prompt continues (a shared prefix stays). Returns
        (blocks dropped from the pool, from tier 2, blocks kept). Raises
        KvsError (ENONS, EDENIED, ENOTCONN, ...)."""
        tp, tn, keep = _u32(tokens)
        r = _EvictResult()
        self._check(self._lib.kvs_evict(self._c, _enc(ns), tp, tn, ctypes.byref(r)))
        del keep
        return r.tier1_blocks, r.tier2_blocks, r.kept_blocks

    def commit(self, tokens, block_ids, ns=None, priority=None, duration_ms=0,
               for_group=False):
        """Commits; returns the canonical block of each committed block.
        priority (0-100): a retention hint for them (see the module doc).
        Several devices (--devices): a rank's commit stands for its own
        shard, and blocks still waiting for another rank's are not in the
        returned list; for_group=True commits for every rank (the group's
        scheduler after its workers wrote). commit_group() also says how
        many wait."""
        return self.commit_group(tokens, block_ids, ns, priority, duration_ms, for_group)[0]

    def commit_group(self, tokens, block_ids, ns=None, priority=None, duration_ms=0,
                     for_group=False, shard_written=False):
        """commit() for a tensor-parallel group: returns (canonical blocks of
        the committed prefix, blocks that wait for another rank's shard).
        for_group=True caches only blocks every rank declared its shard of
        written for these tokens; shard_written=True (a rank) declares this
        rank's shard written and caches nothing."""
        tp, tn, tk = _u32(tokens)
        ip, n_ids, ik = _u32(block_ids)
        out = (ctypes.c_uint32 * max(1, 2 * n_ids))()
        done, pending = ctypes.c_size_t(), ctypes.c_size_t()
        opts = _CommitOpts()
        self._lib.kvs_commit_opts_init(ctypes.byref(opts))
        opts.hint = _hint(priority, duration_ms)
        opts.for_group = 1 if for_group else 0
        opts.shard_written = 1 if shard_written else 0
        opts.n_pending = ctypes.pointer(pending)
        rc = self._lib.kvs_commit_ex(self._c, _enc(ns), tp, tn, ip, n_ids, ctypes.byref(opts),
                                     out, ctypes.byref(done))
        del tk, ik
        self._check(rc)
        return list(out[:done.value]), pending.value

    def pin(self, block_ids, priority=None, duration_ms=0):
        """Pins cached blocks; returns how many. priority, duration_ms: a
        retention hint for every block pinned (see the module doc)."""
        p, n, keep = _u32(block_ids)
        done = ctypes.c_size_t()
        self._check(self._lib.kvs_pin_hint(self._c, p, n, ctypes.byref(done),
                                           _hint(priority, duration_ms)))
        return done.value

    def release(self, block_ids, priority=None, duration_ms=0):
        """Releases pins and WRITING blocks; returns how many. priority,
        duration_ms: a retention hint for every cached block released."""
        p, n, keep = _u32(block_ids)
        done = ctypes.c_size_t()
        self._check(self._lib.kvs_release_hint(self._c, p, n, ctypes.byref(done),
                                               _hint(priority, duration_ms)))
        return done.value

    def stats(self):
        s = _Stats()
        self._check(self._lib.kvs_stats(self._c, ctypes.byref(s)))
        try:
            out = {name: getattr(s, name) for name, _ in _Stats._fields_
                   if name not in ("namespaces", "n_namespaces", "backend", "reserved",
                                   "reserved32", "counters", "devices", "n_devices",
                                   "disk_io", "cluster_nodes", "n_cluster_nodes")}
            for i, name in enumerate(counter_names(self._lib)):
                out[name] = s.counters[i]
            out["backend"] = "cuda" if s.backend == BACKEND_CUDA else "host"
            out["copy_path"] = s.copy_path.decode() if s.copy_path else None
            out["devices"] = []
            for i in range(s.n_devices):
                d = s.devices[i]
                row = {name: getattr(d, name) for name, _ in _DeviceStats._fields_
                       if not name.startswith("reserved")}
                row["detail"] = d.detail.decode()
                out["devices"].append(row)
            out["disk_io"] = s.disk_io.decode() if s.disk_io else None
            out["cluster_nodes"] = []
            for i in range(s.n_cluster_nodes):
                nd = s.cluster_nodes[i]
                row = {name: getattr(nd, name) for name, _ in _ClusterNode._fields_
                       if not name.startswith("reserved")}
                row["address"] = nd.address.decode()
                row["state"] = nd.state.decode()
                out["cluster_nodes"].append(row)
            out["namespaces"] = []
            for i in range(s.n_namespaces):
                ns = s.namespaces[i]
                row = {name: getattr(ns, name) for name, _ in _NsStats._fields_
                       if not name.startswith("reserved") and name != "bands"}
                row["name"] = ns.name.decode()
                if ns.bands:
                    bands = ns.bands.contents
                    row["cached_by_priority"] = dict(zip(PRIORITY_BANDS, bands.cached))
                    row["evicted_by_priority"] = dict(zip(PRIORITY_BANDS, bands.evicted))
                out["namespaces"].append(row)
            return out
        finally:
            self._lib.kvs_stats_free(ctypes.byref(s))

    def tree(self, ns=None, by_size=False, max_rows=20):
        rows = (_Prefix * max_rows)()
        n = ctypes.c_size_t()
        self._check(self._lib.kvs_tree(self._c, _enc(ns), 1 if by_size else 0, rows, max_rows,
                                       ctypes.byref(n)))
        out = []
        for r in rows[:n.value]:
            d = {name: getattr(r, name) for name, _ in _Prefix._fields_ if name != "reserved"}
            d["ns"] = r.ns.decode()
            out.append(d)
        return out

    def restore_status(self):
        """The disk tier's warm restart: a dict with phase ("scanning",
        "restoring", "done", "failed", or "" when none ran), slots, scanned,
        records, restored, dropped and elapsed_ms."""
        rs = _RestoreStatus()
        self._check(self._lib.kvs_restore_status(self._c, ctypes.byref(rs)))
        d = {name: getattr(rs, name) for name, _ in _RestoreStatus._fields_
             if name not in ("phase", "reserved")}
        d["phase"] = rs.phase.decode()
        return d

    def wait_restored(self, seconds=60):
        """Waits until the warm restart ended (or none runs); its status."""
        end = time.monotonic() + seconds
        while True:
            st = self.restore_status()
            if st["phase"] not in ("scanning", "restoring") or time.monotonic() > end:
                return st
            time.sleep(0.01)

    def ping(self, size=64):
        """Round-trip time in microseconds."""
        rtt = ctypes.c_double()
        self._check(self._lib.kvs_ping(self._c, size, ctypes.byref(rtt)))
        return rtt.value


def strerror(status):
    return load_library().kvs_strerror(status).decode()
