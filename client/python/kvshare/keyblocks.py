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

import kvshare

__all__ = ["EngineGeometry", "GeometryMismatch", "KeyBlocks", "key_tokens", "tokens_key",
           "check_geometry"]

# dtype names as kvshared spells them, and their sizes.
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
# PyTorch dtype names -> kvshared's.
TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}


class GeometryMismatch(ValueError):
    """The engine's KV layout differs from the pool's: the plug-in refuses to start."""


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
        self.refused = None  # the GeometryMismatch that disabled this store
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
        came back with another geometry disables the store (a miss for
        ever, the reason in .refused) instead of failing the engine."""
        if self.refused is not None:
            return False
        if not self.client.connected or self.client.epoch != self._epoch:
            try:
                self.client.ping()  # reconnects when the daemon is back
            except kvshare.KvsError:
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

    def release(self, block_ids):
        """Drops one pin (or a WRITING block) of this session on each id;
        ignores an unreachable daemon (the session is gone, and all it held
        with it)."""
        ids = [b for b in block_ids if b is not None]
        if not ids:
            return
        try:
            self.client.release(ids)
        except kvshare.KvsError as e:
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
