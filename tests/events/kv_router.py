# SPDX-License-Identifier: Apache-2.0
"""What a cluster router does with kvshared's KV events, modelled on the
consumer rules of llm-d's kv-cache indexer and Dynamo's KV router (written
from their documented behaviour; see docs/ROUTING.md):

- decode: vLLM's schema, a batch [ts, events, dp_rank] whose events are maps
  tagged by "type" or positional arrays with the tag first;
- Subscriber: SUB socket; seq must go up by one; a gap is filled from the
  replay socket (either reply framing) or the subscriber fails;
- LlmdIndex: topic kv@POD@MODEL (lora_name overrides the model), drops a
  BlockStored whose parent engine key it has not seen, re-keys blocks with
  FNV-64a over canonical CBOR of [parent, tokens, None];
- DynamoIndex: block_size must match, no repeated hashes nor the parent among
  them, re-keys blocks with XXH3-64 (seed 1337) of the little-endian u32
  tokens, chained as XXH3-64(parent || block) and walks a radix tree.
"""
import struct

import cbor2
import msgpack
import xxhash
import zmq

END_SEQ = b"\xff" * 8

FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
                    "kv_cache_spec_sliding_window"],
    "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    "AllBlocksCleared": [],
}
REQUIRED = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}


class ProtocolError(Exception):
    pass


def decode_event(raw):
    """One event as a dict with "type", from the map or the array form."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind not in FIELDS:
            raise ProtocolError("unknown event %r" % (raw,))
        unknown = set(raw) - set(FIELDS[kind]) - {"type"}
        if unknown:
            raise ProtocolError("unknown fields %s in %s" % (sorted(unknown), kind))
        ev = {name: raw.get(name) for name in FIELDS[kind]}
        for name in ("lora_id", "medium", "lora_name") if kind == "BlockStored" else ():
            if name not in raw:
                raise ProtocolError("%s lacks %s, which vLLM always writes" % (kind, name))
    elif isinstance(raw, list) and raw and raw[0] in FIELDS:
        kind = raw[0]
        values = raw[1:]
        if len(values) < REQUIRED[kind] or len(values) > len(FIELDS[kind]):
            raise ProtocolError("%s with %d fields" % (kind, len(values)))
        ev = dict(zip(FIELDS[kind], values + [None] * (len(FIELDS[kind]) - len(values))))
    else:
        raise ProtocolError("not an event: %r" % (raw,))
    ev["type"] = kind
    return ev


def decode_batch(payload):
    """[ts, [events], dp_rank] -> (ts, [event dicts], dp_rank); also returns
    the form of the events ("map" or "array")."""
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(batch, list) or len(batch) != 3:
        raise ProtocolError("a batch is an array of 3, got %r" % (batch,))
    ts, events, rank = batch
    if not isinstance(ts, float) or not isinstance(events, list):
        raise ProtocolError("bad batch header %r" % (batch[:1],))
    forms = {"map" if isinstance(e, dict) else "array" for e in events}
    return ts, [decode_event(e) for e in events], rank, forms


def fnv64a(data, h=0xcbf29ce484222325):
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def llmd_hash(parent, tokens, extra=None):
    return fnv64a(cbor2.dumps([parent, None if tokens is None else list(tokens), extra],
                              canonical=True))


def dynamo_local(tokens):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(tokens), *tokens), seed=1337)


def dynamo_chain(parent, local):
    return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local), seed=1337)


def chunks(tokens, bs):
    return [tokens[i:i + bs] for i in range(0, len(tokens) - bs + 1, bs)]


class LlmdIndex:
    """llm-d's kv-cache indexer for one node: request keys by pod."""

    def __init__(self, block_size, hash_seed=""):
        self.bs = block_size
        self.init = fnv64a(hash_seed.encode())
        self.engine = {}   # (pod, engine key) -> (request key, model)
        self.keys = {}     # request key -> {pod: tier}
        self.dropped = 0

    def model_init(self, model):
        return llmd_hash(self.init, None, model)

    def apply(self, topic, ev):
        parts = topic.split("@")
        if len(parts) != 3 or parts[0] != "kv":
            raise ProtocolError("topic %r is not kv@POD@MODEL" % topic)
        pod, model = parts[1], parts[2]
        kind = ev["type"]
        if kind == "AllBlocksCleared":
            for (p, k) in [x for x in self.engine if x[0] == pod]:
                self._drop(pod, k)
            return
        if kind == "BlockRemoved":
            for k in ev["block_hashes"]:
                self._drop(pod, k, ev["medium"].lower())
            return
        if ev["lora_name"]:
            model = ev["lora_name"]
        parent = ev["parent_block_hash"]
        if parent is not None:
            if (pod, parent) not in self.engine:
                self.dropped += 1   # parents must come first
                return
            prev = self.engine[(pod, parent)][0]
        else:
            prev = self.model_init(model)
        tier = ev["medium"].lower()
        for key, chunk in zip(ev["block_hashes"], chunks(ev["token_ids"], self.bs)):
            prev = llmd_hash(prev, chunk)
            tiers = self.keys.setdefault(prev, {}).setdefault(pod, set())
            tiers.add(tier)
            self.engine[(pod, key)] = (prev, model)

    def _drop(self, pod, engine_key, tier=None):
        """A BlockRemoved drops the pod's entry on that tier only; the
        block leaves the pod with its last tier (None: every tier)."""
        entry = self.engine.get((pod, engine_key))
        if entry and tier is not None:
            tiers = self.keys.get(entry[0], {}).get(pod, set())
            tiers.discard(tier)
            if tiers:
                return
        entry = self.engine.pop((pod, engine_key), None)
        if entry:
            pods = self.keys.get(entry[0], {})
            pods.pop(pod, None)
            if not pods:
                self.keys.pop(entry[0], None)

    def longest_prefix(self, pod, model, tokens):
        """Blocks of tokens the pod holds, from the start, as llm-d scores."""
        prev, n = self.model_init(model), 0
        for chunk in chunks(tokens, self.bs):
            prev = llmd_hash(prev, chunk)
            if pod not in self.keys.get(prev, {}):
                break
            n += 1
        return n


class DynamoIndex:
    """Dynamo's KV router for one worker: a radix tree of local block hashes."""

    def __init__(self, block_size):
        self.bs = block_size
        self.root = {}
        self.nodes = {}   # engine key -> (children dict, parent children, local, seq hash)
        self.media = {}   # engine key -> the storage tiers that hold it
        self.dropped = 0

    def apply(self, ev):
        kind = ev["type"]
        if kind == "AllBlocksCleared":
            self.root, self.nodes, self.media = {}, {}, {}
            return
        if kind == "BlockRemoved":
            for k in ev["block_hashes"]:
                # A claim per storage tier: the block stays while another
                # tier holds it.
                media = self.media.get(k, set())
                media.discard(ev["medium"])
                if media:
                    continue
                self.media.pop(k, None)
                node = self.nodes.pop(k, None)
                if node:
                    node[1].pop(node[2], None)
            return
        hashes = ev["block_hashes"]
        if ev["block_size"] != self.bs or len(set(hashes)) != len(hashes) or \
                ev["parent_block_hash"] in hashes or \
                len(ev["token_ids"]) != len(hashes) * self.bs:
            self.dropped += 1
            return
        parent = ev["parent_block_hash"]
        if parent is None:
            children, seq = self.root, None
        elif parent in self.nodes:
            children, seq = self.nodes[parent][0], self.nodes[parent][3]
        else:
            self.dropped += 1
            return
        for key, chunk in zip(hashes, chunks(ev["token_ids"], self.bs)):
            local = dynamo_local(chunk)
            seq = local if seq is None else dynamo_chain(seq, local)
            node = children.setdefault(local, ({}, children, local, seq))
            self.nodes[key] = node
            self.media.setdefault(key, set()).add(ev["medium"])
            children = node[0]

    def longest_prefix(self, tokens):
        children, n = self.root, 0
        for chunk in chunks(tokens, self.bs):
            node = children.get(dynamo_local(chunk))
            if node is None:
                break
            children, n = node[0], n + 1
        return n


class Subscriber:
    """A SUB socket that checks seq and fills gaps from the replay socket."""

    def __init__(self, ctx, endpoint, replay=None, framing="plain", rcvhwm=None, topic=b"",
                 default_topic=None, identity=None):
        # The plain replay framing carries no topic: a consumer that keys by
        # worker (Dynamo) has one model per stream, default_topic here.
        self.ctx, self.replay, self.framing = ctx, replay, framing
        self.default_topic = default_topic
        # With several identities, replay requests name their stream.
        self.identity = identity
        self.sock = ctx.socket(zmq.SUB)
        if rcvhwm is not None:
            self.sock.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.next_seq = None
        self.gaps = self.replayed = 0
        self.forms = set()
        self.batches = []  # (topic, [events]) in seq order

    def _take(self, topic, seq, payload):
        if topic is None:
            if self.default_topic is None:
                raise ProtocolError("a plain replay reply has no topic and the stream has "
                                    "more than one model")
            topic = self.default_topic
        ts, events, rank, forms = decode_batch(payload)
        if rank is not None:
            raise ProtocolError("data_parallel_rank %r" % rank)
        self.forms |= forms
        self.batches.append((topic.decode() if isinstance(topic, bytes) else topic, events))
        self.next_seq = seq + 1

    def fetch_replay(self, start):
        """Asks for every batch from start on; returns [(topic, seq, payload)]."""
        if not self.replay:
            raise ProtocolError("gap at seq %d and no replay socket" % start)
        req = self.ctx.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay)
        req.send_multipart([b"", struct.pack(">Q", start)] +
                           ([self.identity.encode()] if self.identity else []))
        out = []
        try:
            while True:
                if not req.poll(10000):
                    raise ProtocolError("replay socket did not answer")
                frames = req.recv_multipart()
                if frames[0] != b"":
                    raise ProtocolError("replay reply without the empty delimiter")
                want = 4 if self.framing == "topic" else 3
                if len(frames) != want:
                    raise ProtocolError("replay reply of %d frames, want %d (framing %s)" %
                                        (len(frames), want, self.framing))
                if frames[-2] == END_SEQ:
                    if frames[-1] != b"":
                        raise ProtocolError("END_SEQ with a payload")
                    return out
                if self.framing == "topic":
                    out.append((frames[1], struct.unpack(">Q", frames[2])[0], frames[3]))
                else:
                    out.append((None, struct.unpack(">Q", frames[1])[0], frames[2]))
        finally:
            req.close()

    def catch_up(self, start=0):
        """A late joiner: everything from start on, from the replay socket."""
        for topic, seq, payload in self.fetch_replay(start):
            if seq != start:
                raise ProtocolError("replay gave seq %d, want %d" % (seq, start))
            self._take(topic, seq, payload)
            start += 1
        self.next_seq = start

    def poll(self, timeout_ms=0):
        """Takes every message available (waiting up to timeout_ms for the
        first); fills gaps. Returns how many batches were taken."""
        n = 0
        while self.sock.poll(timeout_ms if n == 0 else 0):
            topic, seqb, payload = self.sock.recv_multipart()
            seq = struct.unpack(">Q", seqb)[0]
            if self.next_seq is None and seq != 0 and self.replay is None:
                raise ProtocolError("joined at seq %d without a replay socket" % seq)
            if self.next_seq is not None and seq < self.next_seq:
                continue  # already had it from a replay
            want = 0 if self.next_seq is None else self.next_seq
            if seq != want:
                self.gaps += 1
                for rtopic, rseq, rpayload in self.fetch_replay(want):
                    if rseq >= seq:
                        break
                    if rseq != want:
                        raise ProtocolError("replay skipped from %d to %d" % (want, rseq))
                    self._take(rtopic, rseq, rpayload)
                    self.replayed += 1
                    want += 1
                if want != seq:
                    raise ProtocolError("gap %d..%d not filled by replay" % (want, seq))
            self._take(topic, seq, payload)
            n += 1
        return n

    def fill_tail(self):
        """Batches lost at the end of the stream show no gap until the next
        message: ask the replay socket for anything after the last seen."""
        start = 0 if self.next_seq is None else self.next_seq
        for topic, seq, payload in self.fetch_replay(start):
            if seq != start:
                raise ProtocolError("replay gave seq %d, want %d" % (seq, start))
            self._take(topic, seq, payload)
            self.replayed += 1
            start += 1

    def close(self):
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.close()


def rebuild(batches, block_size):
    """Applies batches to an llm-d and a Dynamo view (one Dynamo view per
    topic: Dynamo keys workers by registration, one per model here)."""
    llmd = LlmdIndex(block_size)
    dynamo = {}
    for topic, events in batches:
        for ev in events:
            llmd.apply(topic, ev)
            dynamo.setdefault(topic, DynamoIndex(block_size)).apply(ev)
    return llmd, dynamo
