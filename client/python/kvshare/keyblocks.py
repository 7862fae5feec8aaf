# SPDX-License-Identifier: Apache-2.0
"""Key blocks: pool blocks named by an engine's key instead of token ids, and
the geometry check every engine plug-in makes at start.

Serving engines name a block of KV by a key chained through its parent
(vLLM's block hash, SGLang's page key), so a key alone names the whole
prefix up to its block. A key block is an ordinary cached block of kvshared
whose token ids are the key:

    tokens = key as little-endian uint32 words, then len(key), then zeros
             up to block_tokens tokens

(a 32-byte key in a 16-token block: 8 words, the length, 7 zeros). Each key
block is committed as a one-block prompt of its namespace, so it hangs from
the namespace's root: engines look keys up from the middle of a chain (after
their own GPU or host hits), which a chained path from the root could not
answer. The daemon's lookup, token verification (a hash collision never
returns another key's block), pins, eviction, quotas and metrics apply
unchanged; no RPC is added. The cost is one Lookup RPC per key looked up
(lookups stop at the first miss) and one Commit RPC per key stored.

Pins outlive one call: KeyBlocks holds its pins in its session (the
engine's scheduler process) until release(), and the daemon frees whatever
the session still holds when it ends, however it ends.
"""
import array
import collections
import functools
import hashlib
import inspect
import json
import logging
import re

import kvshare

__all__ = ["EngineGeometry", "GeometryMismatch", "KeyBlocks", "key_tokens", "tokens_key",
           "check_geometry", "default_namespace", "kvs_dtype", "open_declared", "Failures",
           "guarded", "client_options"]

log = logging.getLogger("kvshare")

# dtype names as kvshared spells them, and their sizes.
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# PyTorch dtype names -> kvshared's.
TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


class GeometryMismatch(ValueError):
    """The engine's KV layout differs from the pool's: the plug-in refuses to start."""


# -- model identity: the default namespace and what Hello declares -------------

def kvs_dtype(name):
    """kvshared's name ("fp32", "fp16", "bf16", "fp8") of an engine's dtype
    (a torch dtype, its name, or vLLM's cache dtype), or None when it has
    none (then the plug-in declares no dtype)."""
    name = str(name or "").replace("torch.", "").lower()
    if name in DTYPE_BYTES:
        return name
    if name.startswith(("fp8", "float8")):
        return "fp8"
    return TORCH_DTYPES.get(name) or {"half": "fp16", "float": "fp32"}.get(name)


def model_slug(model, limit=20):
    """A short readable name of a model: the last part of its name or path,
    lowercase, [a-z0-9.] and dashes, at most limit characters."""
    base = str(model).rstrip("/").rsplit("/", 1)[-1].lower()
    slug = re.sub(r"[^a-z0-9.]+", "-", base)[:limit].strip("-.")
    return slug or "model"


def default_namespace(engine, fields):
    """"ENGINE-SLUG-HASH": the namespace a plug-in uses when none is
    configured. fields: what the engine reports of its model identity (the
    model's name, revision, dtype, geometry, parallel layout: a dict, model
    required); HASH is 12 hex digits of a SHA-256 over all of them, so two
    models (a base model and its fine-tune) never share a namespace, and two
    instances of one model always do. At most 40 bytes (room for SGLang's
    rank suffixes within kvshared's 63)."""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return "%s-%s-%s" % (engine, model_slug(fields["model"]), digest)


def declared_identity(ns, model, revision=None, dtype=None, layers=0, kv_heads=0, head_dim=0,
                      block_tokens=0, tp_size=1):
    """The kvshare.Identity a plug-in declares in Hello, or None without a
    model name. A revision kvshared would refuse (spaces, over 63 bytes) is
    left out (it still names the namespace); a model name over 255 bytes
    keeps its last 255."""
    if not model:
        return None
    model = str(model)
    while len(model.encode()) > 255:
        model = model[1:]
    if revision is not None:
        revision = str(revision)
        if not revision or len(revision.encode()) > 63 or any(c.isspace() for c in revision):
            revision = None
    return kvshare.Identity(model=model, ns=ns, revision=revision, dtype=kvs_dtype(dtype),
                            layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                            block_tokens=block_tokens, tp_size=tp_size)


def client_options():
    """What every plug-in client passes to kvshare.Client besides its own
    settings: the circuit breaker (KVS_BREAKER), always on, so that a daemon
    that stopped answering costs one timeout and then fails every call at
    once (lookups miss) until a background probe finds it again. Empty with
    a binding that predates the breaker."""
    params = inspect.signature(kvshare.Client.__init__).parameters
    return {"breaker": True} if "breaker" in params else {}


class Failures:
    """The failures a plug-in's entry points turned into the engine's own
    failure values (a miss, False, a declined store): counted by kind (the
    entry point and the error's name) and logged once per kind, so that a
    daemon that is gone does not flood the engine's log."""

    def __init__(self, who):
        self.who = who
        self.counts = collections.Counter()

    def note(self, where, err):
        kind = "%s: %s" % (where, getattr(err, "name", None) or type(err).__name__)
        self.counts[kind] += 1
        if self.counts[kind] == 1:
            log.warning("%s: %s failed (%s); the engine sees a miss or a declined store, "
                        "and later failures of this kind are only counted", self.who, where,
                        err)


def guarded(fallback):
    """Decorates a plug-in entry point (a method of an object with a
    .failures Failures): any Exception it raises is noted and the call
    returns fallback(self, *args) instead, so nothing of kvshare's raises
    into an engine thread. The signature stays the method's own."""
    def wrap(fn):
        @functools.wraps(fn)
        def entry(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the engine must never see it
                self.failures.note(fn.__name__, e)
                return fallback(self, *args, **kwargs)
        return entry
    return wrap


_LOGGED = set()


def identity_refused(who, err):
    """Logs, once per process and message, that kvshared refused the
    engine's model identity (KVS_EIDENTITY): the plug-in then runs as a
    cache that always misses."""
    msg = getattr(err, "message", str(err))
    if (who, msg) in _LOGGED:
        return
    _LOGGED.add((who, msg))
    log.error("%s: kvshared refused this engine's model (KVS_EIDENTITY), so the plug-in runs "
              "as a cache that always misses (the engine computes every prefix itself): %s",
              who, msg)


def open_declared(who, connect, check):
    """A client from connect(True) (lazy, declaring the plug-in's model
    identity in Hello), whose refusal by a running daemon is sorted out:

    - KVS_EIDENTITY (the namespace holds another model's KV): logged once
      (identity_refused); the client is returned with .refusal set, and
      KeyBlocks over it always misses. The engine is not stopped.
    - any other refusal (the identity's layout is not the pool's): check()
      runs on a client from connect(False) (no identity) and raises
      GeometryMismatch naming both layouts; if it does not,
      GeometryMismatch with the daemon's message.

    No daemon (or one that does not answer) is no refusal: lookups miss
    until it comes."""
    client = connect(True)
    client.refusal = None
    if client.connected or client.declared is None:
        return client
    try:
        client.ping()  # a lazy connect keeps no status: ask again for it
        return client
    except kvshare.KvsError as e:
        err = e
    if err.status in (kvshare.STATUS["ENOTCONN"], kvshare.STATUS["ETIMEDOUT"]):
        return client
    if err.status == kvshare.STATUS["EIDENTITY"]:
        identity_refused(who, err)
        client.refusal = err
        return client
    client.close()
    probe = connect(False)
    try:
        if probe.connected:
            check(probe)
    finally:
        probe.close()
    raise GeometryMismatch("%s refuses to start: kvshared refused the engine's model identity: "
                           "%s" % (who, err.message))


class EngineGeometry:
    """The KV layout of an engine: what one pool block must hold.

    layers, kv_heads, head_dim: per worker (after tensor parallelism);
    dtype: "fp32", "fp16", "bf16", "fp8" or a torch dtype; block_tokens:
    tokens per stored block (vLLM's offloaded block, SGLang's page);
    kv_order: "kv" (K then V, as the pool) is the only order supported."""

    def __init__(self, layers, kv_heads, head_dim, dtype, block_tokens, kv_order="kv"):
        name = str(dtype).replace("torch.", "")
        self.layers, self.kv_heads, self.head_dim = int(layers), int(kv_heads), int(head_dim)
        self.dtype = TORCH_DTYPES.get(name, name)
        self.block_tokens = int(block_tokens)
        self.kv_order = kv_order

    def describe(self):
        return ("%d layers x %d kv heads x %d head dim, %s, %d tokens per block, %s order"
                % (self.layers, self.kv_heads, self.head_dim, self.dtype, self.block_tokens,
                   self.kv_order.upper()))

    @property
    def slot_bytes(self):
        """One block, one layer, K or V."""
        return self.block_tokens * self.kv_heads * self.head_dim * DTYPE_BYTES.get(self.dtype, 0)


def check_geometry(pool, engine, who):
    """Raises GeometryMismatch naming both layouts unless the engine's layout
    (an EngineGeometry) equals the pool's (kvshare.Client.geometry). who names
    the plug-in in the message."""
    pool_geo = EngineGeometry(pool["layers"], pool["kv_heads"], pool["head_dim"],
                              pool["dtype"], pool["block_tokens"])
    diffs = [f for f in ("layers", "kv_heads", "head_dim", "dtype", "block_tokens", "kv_order")
             if getattr(pool_geo, f) != getattr(engine, f)]
    if diffs:
        raise GeometryMismatch(
            "%s refuses to start: the engine's KV layout (%s) differs from the kvshared "
            "pool's (%s) in %s; start kvshared with the engine's geometry (--layers, "
            "--kv-heads, --head-dim, --dtype, --block-tokens) or point the plug-in at a "
            "daemon that has it" % (who, engine.describe(), pool_geo.describe(),
                                    ", ".join(diffs)))


def key_tokens(key, block_tokens):
    """The token ids of key's block (an array of uint32): key (bytes, a
    multiple of 4 long, at least 16) as little-endian words, its length in
    bytes, zeros. Raises ValueError for a key that does not fit."""
    if not isinstance(key, (bytes, bytearray)):
        raise ValueError("a block key must be bytes, not %s (vLLM: set "
                         "--prefix-caching-hash-algo sha256 or sha256_cbor)" % type(key).__name__)
    n = len(key)
    if n < 16 or n % 4:
        raise ValueError("a block key of %d bytes: need a multiple of 4, at least 16" % n)
    if n // 4 + 1 > block_tokens:
        raise ValueError("a %d-byte key does not fit in a block of %d tokens (%d bytes with "
                         "its length): use blocks of at least %d tokens"
                         % (n, block_tokens, 4 * block_tokens, n // 4 + 1))
    tokens = array.array("I")
    tokens.frombytes(bytes(key))
    if tokens.itemsize != 4:
        raise ValueError("array('I') is not 32-bit here")
    if array.array("I", [1]).tobytes() != b"\x01\x00\x00\x00":
        tokens.byteswap()
    tokens.append(n)
    tokens.extend([0] * (block_tokens - len(tokens)))
    return tokens


def tokens_key(tokens):
    """The key a key block's token ids hold (the inverse of key_tokens), or
    None when they are not a key block's (a block of token ids)."""
    k = max((i for i, t in enumerate(tokens) if t), default=-1)
    if k < 4 or tokens[k] != 4 * k:
        return None
    words = array.array("I", tokens[:k])
    if array.array("I", [1]).tobytes() != b"\x01\x00\x00\x00":
        words.byteswap()
    return words.tobytes()


class KeyBlocks:
    """One namespace of key blocks, used through one session.

    client: a kvshare.Client (its session owns every pin and WRITING block
    taken here). Every method that reads treats an unreachable daemon as a
    miss; the ones that change state raise kvshare.KvsError."""

    def __init__(self, client, ns, engine=None, who="kvshare"):
        self.client = client
        self.ns = ns
        self.engine = engine
        self.who = who
        self.block_tokens = None
        # What disabled this store: a GeometryMismatch, or kvshared's
        # refusal of the engine's model (KVS_EIDENTITY).
        self.refused = getattr(client, "refusal", None)
        self._epoch = None
        if client.connected:
            self._check()

    def _check(self):
        """(Re)reads the pool's geometry after each (re)connect; with an
        engine layout given, checks it (raises GeometryMismatch)."""
        self._epoch = self.client.epoch
        geo = self.client.geometry
        if self.engine is not None:
            check_geometry(geo, self.engine, self.who)
        self.block_tokens = geo["block_tokens"]

    def usable(self):
        """Whether the daemon is there with the right geometry. A daemon that
        came back with another geometry, or refused the engine's model,
        disables the store (a miss for ever, the reason in .refused)
        instead of failing the engine."""
        if self.refused is not None:
            return False
        if not self.client.connected or self.client.epoch != self._epoch:
            try:
                self.client.ping()  # reconnects when the daemon is back
            except kvshare.KvsError as e:
                if e.status == kvshare.STATUS["EIDENTITY"]:
                    # The namespace holds another model's KV now (a daemon
                    # restarted with another config): misses from now on.
                    identity_refused(self.who, e)
                    self.refused = e
                return False
            try:
                self._check()
            except GeometryMismatch as e:
                self.refused = e
                return False
        return True

    def tokens(self, key):
        return key_tokens(key, self.block_tokens)

    def _lookup(self, key, pin):
        if not self.usable():
            return None
        try:
            ids = self.client.lookup(self.tokens(key), ns=self.ns, pin=pin)
        except kvshare.KvsError:
            return None
        return ids[0] if ids else None

    def find(self, key):
        """The block holding key, or None (not cached, or no daemon)."""
        return self._lookup(key, False)

    def present_run(self, keys):
        """How many leading keys are cached (0 without a daemon)."""
        n = 0
        for key in keys:
            if self._lookup(key, False) is None:
                break
            n += 1
        return n

    def pin(self, keys):
        """Pins each key's block for this session: a list of block ids, None
        where the key is not cached (evicted, never stored, no daemon)."""
        return [self._lookup(key, True) for key in keys]

    def release(self, block_ids, epoch=None):
        """Drops one pin (or a WRITING block) of this session on each id;
        ignores an unreachable daemon (the session is gone, and all it held
        with it). epoch: the client's epoch when the ids were taken; after a
        reconnect since, nothing is sent (the ids were the old session's,
        released with it, and would name other blocks now)."""
        ids = [b for b in block_ids if b is not None]
        if not ids or (epoch is not None and epoch != self.client.epoch):
            return
        try:
            self.client.release(ids)
        except kvshare.KvsError as e:
            if epoch is not None and epoch != self.client.epoch:
                return  # this call reconnected: the old session took its blocks along
            if e.status not in (kvshare.STATUS["ENOTCONN"], kvshare.STATUS["ETIMEDOUT"]):
                raise

    def alloc(self, n):
        """n WRITING blocks owned by this session (the daemon evicts unpinned
        blocks when the pool is full). Raises KvsError (KVS_EPOOLFULL, ...)."""
        if not n:
            return []
        if not self.usable():
            raise kvshare.KvsError(kvshare.STATUS["ENOTCONN"], self.client.last_error or
                                   str(self.refused))
        return self.client.alloc(n, ns=self.ns)

    def alloc_evicting(self, n):
        """alloc(n), and the keys of this namespace's blocks that the daemon
        evicted to make room for them: (ids, keys). Blocks of other
        namespaces, and evictions by other requests, are not reported."""
        if not n:
            return [], []
        if not self.usable():
            raise kvshare.KvsError(kvshare.STATUS["ENOTCONN"], self.client.last_error or
                                   str(self.refused))
        ids, evicted = self.client.alloc_report(n, self.ns)
        keys = [tokens_key(t) for t in evicted]
        return ids, [k for k in keys if k is not None]

    def commit(self, key, block):
        """Commits a written block under key; returns the block that now holds
        key, pinned once for this session: `block`, or another session's
        block committed first (then `block` stays WRITING: release it)."""
        return self.client.commit(self.tokens(key), [block], ns=self.ns)[0]
