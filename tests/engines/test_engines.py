# SPDX-License-Identifier: Apache-2.0
"""The vLLM and SGLang plug-ins (kvshare.vllm, kvshare.sglang) against a real
kvshared (host backend, CPU tensors), loaded and called through the engines'
own interface modules (mirrors in tests/engines/upstream/) in each engine's
call order (engines.py).

    test_engines.py --kvshared PATH --lib PATH [--vllm-layout base|release]
                    [--only NAME ...]

--vllm-layout picks vLLM's interface: base (vllm/v1/kv_offload/base.py, the
newest; default) or release (abstract/spec/mediums/worker of the releases).

Cases:
  signatures      the plug-in classes derive from the engines' own base classes,
                  leave no abstract method out, and every method they override
                  takes the base's parameters (names, order, defaults)
  vllm_order      the spec made by vLLM's factory (issubclass check), the
                  manager and worker subclasses of vLLM's own; lookups repeated
                  (same answer), a lookup pins what it finds, prepare_load,
                  transfer, complete_load drops the pins, the end of a request
                  drops pins no load took; prepare_store, transfer,
                  complete_store; events; both KV tensor layouts
  vllm_tp2        a vLLM engine with tensor parallelism 2 (a scheduler and two
                  workers, each one of two KV heads) on one kvshared --devices
                  0-1: engine B finds engine A's prompt with one lookup per key
                  and each worker loads its own head, bitwise; a store one
                  rank could not make is never served, nothing left WRITING
                  (given back in one RPC, off complete_store: no RPC on the
                  scheduler's step there)
  vllm_no_fail    between a lookup and its load: the pool is taken by another
                  worker (eviction), the namespace cleared, or the daemon
                  killed, or restarted: every load is served, bytes equal, and
                  no transfer fails; after a restart, lookups miss until the
                  worker maps the new pool; blocks evicted before the lookup,
                  or no daemon, are misses
  vllm_preempt    complete_store called before the worker's copy has finished
                  (the releases' scheduler on preemption): the blocks are not
                  visible until the copy is done, then they are, intact
  sglang_order    batch_exists, batch_set_v1, batch_get_v1 with host indices;
                  set/get/exists; stats(); clear and delete (a page being
                  read stays)
  sglang_ranks    pipeline and attention context-parallel ranks (and tensor)
                  that hold different KV under the same page keys each read
                  back their own pages
  sglang_tp2      SGLang with TP=2 on one kvshared --devices 0-1: the ranks store
                  the same pages without talking to each other (the daemon
                  gives each the block the other declared); a page is found
                  once both shards are in; each rank reads back its own head
  sglang_paths    without interface_v1 (SGLang's per-page batch_get/batch_set
                  with flat pages) the pages round-trip too; with storage
                  metrics on, get_stats() gives a StorageMetrics that SGLang's
                  collector accepts
  vllm_two        instance A stores a prompt's KV in one process, instance B in
                  another loads it into its own tensors: the bytes equal A's,
                  and B's attention output on a continuation equals computing
                  the whole prompt itself (bitwise)
  sglang_two      the same with two SGLang instances
  cross           a vLLM and an SGLang instance on one daemon never see each
                  other's blocks, even under the same key bytes
  daemon_down     no daemon: misses, declined stores, no error; a daemon that
                  goes away mid-run: misses again
  evicted         SGLang: pages evicted between batch_exists and batch_get_v1
                  are False (SGLang's miss path)
  killed          a process killed with lookup pins and a store in flight
                  (WRITING blocks held): the daemon frees everything it held
  geometry        a plug-in whose KV layout differs from the pool's, or with
                  several vLLM workers, is refused at start, with both layouts
                  in the message
  identity        no namespace configured: each model gets its own (a
                  fine-tune never finds its base model's blocks), two
                  instances of one model share; each plug-in declares the
                  model in Hello; one configured into another model's
                  namespace is refused by kvshared, logs it once and misses
  hash_seed       vLLM without PYTHONHASHSEED (or with the builtin hash
                  algorithm) is refused at start, naming what to set
  copier          kvshare.tensors.BlockCopier, each copy method (memmove,
                  index, slices), against indexing by hand: runs and scattered
                  blocks, rows with gaps, pool blocks holding 2 engine blocks;
                  an index out of range is refused before anything is copied

Exit status: 0 passed, 1 failed, 77 skipped (no PyTorch; the reason printed).
"""
import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The vLLM layout is chosen before engines.py imports vLLM's interface.
for _i, _a in enumerate(sys.argv):
    if _a == "--vllm-layout" and _i + 1 < len(sys.argv):
        os.environ["KVS_VLLM_LAYOUT"] = sys.argv[_i + 1]
    elif _a.startswith("--vllm-layout="):
        os.environ["KVS_VLLM_LAYOUT"] = _a.split("=", 1)[1]
import engines  # noqa: E402
from engines import Failure, check  # noqa: E402

PASS, FAIL, SKIP = 0, 1, 77
ARGS = None


def daemon(extra=()):
    return engines.daemon(ARGS.kvshared, extra)


def same_bytes(torch, a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


# -- vLLM call order ---------------------------------------------------------

def steps_until(inst, pred, seconds=10.0):
    """Worker steps (get_finished) until pred() holds: the plug-ins' clients
    have a circuit breaker, so a daemon that comes back is seen at the
    breaker's next probe (50 ms after it tripped, then backing off to 2 s)."""
    return engines.wait_for(lambda: inst.finished() is None or pred(), seconds)


def found(inst, hashes, req):
    """A lookup of hashes that found them all (its pins dropped)."""
    n = inst.lookup(hashes, req=req)
    inst.finish(req)
    return n == len(hashes)


def wait_events(inst, seconds=10.0):
    """take_events() until it gives something (stored events are found off
    the scheduler's step, by the plug-in's own thread), or seconds pass."""
    out = []
    engines.wait_for(lambda: out.extend(inst.events()) or out, seconds)
    return out


def ns_pinned(inst, ns):
    row = engines.ns_row(inst.manager.core.client, ns)
    return row["pinned_blocks"] if row else 0


def hashes_of(seed, blocks):
    return engines.vllm_hashes(engines.prompt(seed, blocks)[0], engines.GEO["block_tokens"])


def case_vllm_order(torch):
    v = engines.kvshare.vllm
    print("-- vLLM layout: %s" % v.LAYOUT)
    check(v.LAYOUT == engines.LAYOUT, "kvshare.vllm picked the layout that imports (%s)"
          % v.LAYOUT)
    d = daemon()
    try:
        for joined in (False, True):
            ns = "vllm.order.%s" % ("joined" if joined else "split")
            print("-- KV tensors: %s" % ("joined (num_blocks, 2, ...)" if joined
                                         else "split K and V"))
            inst = engines.VllmInstance(d.socket, ns=ns, joined=joined)
            check(isinstance(inst.spec, v.OffloadingSpec) and
                  isinstance(inst.manager, v.OffloadingManager) and
                  (isinstance(inst.worker, v.OffloadingWorker) if v.LAYOUT == "newest" else
                   isinstance(inst.load_handler, v.OffloadingHandler)),
                  "the factory made the spec; spec, manager and worker derive from vLLM's own")
            tokens, _ = engines.prompt(11, 4)
            hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
            m = engines.model(torch)
            _, ks, vs = m.prefill(tokens)
            inst.write_kv([3, 4, 9, 10], ks, vs)
            check(inst.lookup(hashes) == 0, "lookup of a new prompt: 0 blocks, again and again")
            inst.finish("r")

            keys = [engines.vllm_key(h) for h in hashes]
            todo = inst.store(hashes, [3, 4, 9, 10])
            check(todo == keys, "prepare_store asks for all 4 blocks; the worker stored them")
            events = wait_events(inst)
            check(events == [keys], "take_events: one stored event with the 4 keys")
            check(inst.events() == [], "events are taken once")
            check(inst.store(hashes, [3, 4, 9, 10]) == [],
                  "prepare_store of stored blocks: nothing to store")
            st = inst.manager.core.client.stats()
            check(st["writing_blocks"] == 0 and ns_pinned(inst, ns) == 0,
                  "after the stores: nothing WRITING, nothing pinned")

            check(inst.lookup(hashes, req="a") == 4, "lookup: all 4 blocks, again and again")
            check(ns_pinned(inst, ns) == 4, "the lookup pinned the 4 blocks (%d pinned)"
                  % ns_pinned(inst, ns))
            check(inst.lookup(hashes[2:], req="b") == 2,
                  "lookup from the middle of the chain (after GPU hits): 2 blocks")
            other = hashes_of(12, 2)
            check(inst.lookup(hashes[:2] + other, req="c") == 2, "lookup stops at the first miss")
            inst.finish("b")
            inst.finish("c")
            if v.LAYOUT == "newest":
                check(ns_pinned(inst, ns) == 4,
                      "the end of other requests leaves request a's pins")
            else:
                check(ns_pinned(inst, ns) == 0, "the releases name no request: lookup pins no "
                      "prepare_load took expire (lookup_pin_ttl_s)")

            spec = inst.prepare_load(hashes, req="a")
            inst.wait_job(inst.submit(True, spec, engines.gpu_spec([0, 1, 12, 13])))
            inst.complete_load(hashes, req="a")
            inst.finish("a")
            check(ns_pinned(inst, ns) == 0, "the transfer succeeds; complete_load drops the pins")
            got_k, got_v = inst.read_kv([0, 1, 12, 13])
            want_k, want_v = inst.read_kv([3, 4, 9, 10])
            check(all(same_bytes(torch, a, b) for a, b in zip(got_k + got_v, want_k + want_v)),
                  "the loaded blocks equal the stored ones byte for byte")
            check(inst.load(hashes[1:], [5, 6, 7], req="d") == 3,
                  "load through the harness: lookup, prepare_load, transfer, complete_load")
            if v.LAYOUT == "newest":
                inst.lookup(hashes, req="e")
                inst.finish("e")
                check(ns_pinned(inst, ns) == 0, "on_request_finished drops pins no load took")
                check(inst.lookup(hashes, req="f") == 4, "request f finds 4 blocks")
                spec = inst.prepare_load(hashes[:2], req="f")
                check(ns_pinned(inst, ns) == 2, "prepare_load of 2 keeps their pins and drops "
                      "the 2 no load of the request will take")
                inst.wait_job(inst.submit(True, spec, engines.gpu_spec([14, 15])))
                inst.complete_load(hashes[:2], req="f")
                inst.finish("f")
                check(ns_pinned(inst, ns) == 0, "complete_load drops the rest")
            inst.close()
    finally:
        d.stop()


def case_signatures(torch):
    """Every method of the engines' base classes that a plug-in class
    overrides takes the same parameters (names, order, defaults), so the
    engines' calls bind whether they pass arguments by position or by
    name; no abstract method is left unimplemented."""
    import inspect
    v, sg = engines.kvshare.vllm, engines.kvshare.sglang
    pairs = [(v.KvshareOffloadingSpec, v.OffloadingSpec),
             (v.KvshareOffloadingManager, v.OffloadingManager),
             (sg.KvshareHiCacheStorage, sg.HiCacheStorage)]
    if v.LAYOUT == "newest":
        pairs.append((v.KvshareOffloadingWorker, v.OffloadingWorker))
    else:
        pairs.append((v.KvshareOffloadingHandler, v.OffloadingHandler))
    for mine, theirs in pairs:
        check(not getattr(mine, "__abstractmethods__", None) and issubclass(mine, theirs),
              "%s derives from %s.%s and implements all its abstract methods (%s)"
              % (mine.__name__, theirs.__module__, theirs.__name__,
                 ", ".join(sorted(getattr(theirs, "__abstractmethods__", ())))))
        for name, fn in vars(theirs).items():
            if name.startswith("_") and name != "__init__" or not callable(fn):
                continue
            ours = getattr(mine, name)
            if ours is fn or isinstance(inspect.getattr_static(theirs, name), staticmethod):
                continue
            want = [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
            got = [(p.name, p.default) for p in inspect.signature(ours).parameters.values()]
            if name == "get_handlers" and got[:2] == want[:2] and got[2:] == [
                    ("attn_backends", None)] and want[2:] in ([], [("attn_backends",
                                                                   inspect.Parameter.empty)]):
                continue  # one get_handlers for both eras: attn_backends (abstract) optional
            check(got == want, "%s.%s%s as %s's" % (mine.__name__, name,
                                                   inspect.signature(ours), theirs.__name__))


def restart_daemon(d, socket):
    """Kills d and starts another daemon on socket, d's (a crash and a
    restart by a supervisor)."""
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    return engines.daemon(ARGS.kvshared, ["--socket", socket])


def case_vllm_no_fail(torch):
    d = daemon()
    daemons = [d]
    try:
        inst = engines.VllmInstance(d.socket, ns="vllm.nofail")
        tokens, _ = engines.prompt(61, 3)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        inst.write_kv([0, 1, 2], ks, vs)
        check(inst.store(hashes, [0, 1, 2]) is not None and inst.lookup(hashes, req="x") == 3,
              "a prompt of 3 blocks stored and found")
        inst.finish("x")
        want = inst.read_kv([0, 1, 2])

        def loaded(dst, what):
            got = inst.read_kv(dst)
            check(all(same_bytes(torch, a, b) for a, b in zip(got[0] + got[1],
                                                               want[0] + want[1])),
                  "%s: the load was served, the bytes equal the stored ones" % what)
            for layer in inst.kv:  # clean for the next load
                layer[:, dst] = 0

        def hog():
            with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                got = c.alloc(engines.POOL_BLOCKS - 3)
                check(len(got) == engines.POOL_BLOCKS - 3 and c.stats()["cached_blocks"] == 3,
                      "another worker took every other block: the pinned 3 stayed cached")
                c.release(got)
        check(inst.load(hashes, [4, 5, 6], req="e", between=hog) == 3,
              "evicting between lookup and load: 3 blocks loaded")
        loaded([4, 5, 6], "eviction between lookup and load")

        def clear():
            with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                check(c.clear("vllm.nofail") == (0, 3), "clear between lookup and load keeps "
                      "the 3 pinned blocks")
        check(inst.load(hashes, [4, 5, 6], req="c", between=clear) == 3,
              "clearing between lookup and load: 3 blocks loaded")
        loaded([4, 5, 6], "clear between lookup and load")

        state = {}

        def kill():
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            state["killed"] = True
        check(inst.load(hashes, [4, 5, 6], req="k", between=kill) == 3,
              "killing the daemon between lookup and load: 3 blocks loaded")
        loaded([4, 5, 6], "daemon killed between lookup and load")
        check(inst.lookup(hashes, req="k2") == 0, "with the daemon dead: lookups miss")
        inst.finish("k2")
        check(inst.store(hashes, [0, 1, 2]) is None, "and stores are declined")

        daemons.append(engines.daemon(ARGS.kvshared, ["--socket", d.socket]))
        check(inst.lookup(hashes, req="n") == 0, "a new daemon: the prompt is not there")
        inst.finish("n")
        # Worker steps: the worker maps the new pool (once its breaker's probe
        # found the daemon), and the scheduler sees it mapped.
        stored = []
        check(steps_until(inst, lambda: stored.append(inst.store(hashes, [0, 1, 2])) or
                          found(inst, hashes, "s")) and any(len(x or []) == 3 for x in stored),
              "stored again in the new daemon (once the worker has mapped it), and found")

        def restart():
            # Daemons started closer than SAME_DAEMON_MS look alike.
            time.sleep(2.5 * engines.kvshare.vllm.SAME_DAEMON_MS / 1000)
            daemons.append(restart_daemon(daemons[-1], d.socket))
        check(inst.load(hashes, [4, 5, 6], req="r", between=restart) == 3,
              "restarting the daemon between lookup and load: 3 blocks loaded")
        loaded([4, 5, 6], "daemon restarted between lookup and load")

        # Restarted again, with no worker step since: the scheduler reconnects
        # first, and the worker has not mapped this daemon's pool yet.
        restart()
        # Another instance of the same model (its identity) stores the block.
        c = engines.kvshare.Client(socket_path=d.socket, map_pool=False,
                                   identity=inst.spec.identity)
        c.release(c.commit(engines.kvshare.keyblocks.key_tokens(
            engines.vllm_key(hashes[0]), engines.GEO["block_tokens"]),
            c.alloc(1, ns="vllm.nofail"), ns="vllm.nofail"))
        c.close()
        check(inst.lookup(hashes[:1], req="u") == 0,
              "a block in a daemon the worker has not mapped yet: a miss")
        inst.finish("u")
        check(steps_until(inst, lambda: found(inst, hashes[:1], "u2")),
              "once the worker has mapped it (its next steps): a hit")
        # Evicted before the lookup: a miss, the engine computes.
        with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as h:
            h.release(h.alloc(engines.POOL_BLOCKS))
        check(inst.load(hashes, [4, 5, 6], req="g") == 0,
              "evicted before the lookup: a miss (0), no load, no failure")
        check(inst.core.counts["load_unserved"] == 0, "no load went unserved")
        inst.close()
    finally:
        for x in daemons:
            x.stop()


class Gate:
    """GPU block ids whose reading waits for open(): a copy held mid-way."""

    def __init__(self, ids):
        self.ids = list(ids)
        self.event = threading.Event()
        self.group_sizes, self.block_indices = (len(self.ids),), (0,)

    def __len__(self):
        return len(self.ids)

    def __iter__(self):
        self.event.wait(60)
        return iter(self.ids)


def case_vllm_preempt(torch):
    d = daemon()
    try:
        inst = engines.VllmInstance(d.socket, ns="vllm.preempt")
        tokens, _ = engines.prompt(81, 2)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        inst.write_kv([2, 3], ks, vs)
        out = inst.prepare_store(hashes, req="p")
        todo = inst.todo(out)
        gate = Gate([2, 3])
        src = engines.gpu_spec([2, 3])
        src.block_ids = gate
        job = inst.submit(False, src, out.store_spec)
        other = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        check(engines.wait_for(lambda: other.stats()["writing_blocks"] == 2),
              "the worker allocated 2 blocks and is copying into them (held mid-copy)")
        inst.complete_store(todo, req="p")  # the scheduler, before the copy ends
        inst.finish("p")
        bt = engines.GEO["block_tokens"]
        key_tokens = engines.kvshare.keyblocks.key_tokens
        seen = [len(other.lookup(key_tokens(k, bt), ns="vllm.preempt", pin=False)) for k in todo]
        check(seen == [0, 0] and other.stats()["writing_blocks"] == 2,
              "complete_store came first: the blocks are not visible while the copy runs")
        gate.event.set()
        inst.wait_job(job)
        seen = [len(other.lookup(key_tokens(k, bt), ns="vllm.preempt", pin=False)) for k in todo]
        check(seen == [1, 1], "once the copy is done the worker committed them (%r %r)" % (inst.core.counts, inst.core.last_error))
        other.close()
        check(inst.load(hashes, [6, 7], req="l") == 2, "and they load")
        got, want = inst.read_kv([6, 7]), inst.read_kv([2, 3])
        check(all(same_bytes(torch, a, b) for a, b in zip(got[0] + got[1], want[0] + want[1])),
              "intact: the loaded blocks equal the stored ones")
        inst.close()
    finally:
        d.stop()


# -- SGLang call order -------------------------------------------------------

def case_sglang_order(torch):
    d = daemon()
    try:
        inst = engines.SglangInstance(d.socket)
        tokens, _ = engines.prompt(21, 4)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        inst.write_kv([2, 3, 7, 8], ks, vs)
        check(inst.storage.batch_exists(keys) == 0, "batch_exists of a new prompt: 0")
        check(inst.store(keys[:3], [2, 3, 7]) == [True] * 3, "batch_set_v1 of 3 pages")
        check(inst.storage.batch_exists(keys) == 3, "batch_exists: the 3 leading pages")
        check(inst.store(keys, [2, 3, 7, 8]) == [True] * 4,
              "batch_set_v1 of 4 pages, 3 of them stored already")
        st = inst.storage.stats()
        check(st["set_present"] == 3 and st["namespace"]["cached_blocks"] == 4,
              "stats(): 3 pages were there, 4 cached in the namespace")
        n, ok = inst.load(keys, [10, 11, 12, 13])
        check(n == 4 and ok == [True] * 4, "batch_exists then batch_get_v1 of 4 pages")
        got = inst.read_kv([10, 11, 12, 13])
        want = inst.read_kv([2, 3, 7, 8])
        check(all(same_bytes(torch, a, b) for a, b in zip(got[0] + got[1], want[0] + want[1])),
              "the pages read equal the pages written byte for byte")
        row = engines.ns_row(inst.storage.client, "sglang.test")
        check(row["pinned_blocks"] == 0 and inst.storage.client.stats()["writing_blocks"] == 0,
              "no pin or WRITING block outlives a call")
        # The per-key interface.
        page = torch.randn(2, engines.GEO["layers"], engines.GEO["block_tokens"],
                           engines.GEO["kv_heads"], engines.GEO["head_dim"])
        key = engines.sglang_keys(engines.prompt(22, 1)[0], engines.GEO["block_tokens"])[0]
        check(not inst.storage.exists(key) and inst.storage.get(key) is None,
              "exists/get of an unknown key: False, None")
        check(inst.storage.set(key, page) and inst.storage.exists(key), "set, then exists")
        check(same_bytes(torch, inst.storage.get(key), page), "get returns the page set")
        check(inst.storage.batch_get([key, keys[0]])[0] is not None, "batch_get")
        # clear() while another instance reads page 0 (its pin): that page
        # stays, the other 4 pages of the namespace go; other namespaces stay.
        other = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        other.release(other.commit(list(range(16)), other.alloc(1, ns="keep"), ns="keep"))
        reader = inst.storage.keys.client
        [pinned] = inst.storage.keys.pin([engines.kvshare.sglang.page_key(keys[0])])
        inst.storage.clear()
        st = inst.storage.stats()
        check(st["sets"] == 0 and st["last_clear"] == {"cleared": 4, "kept": 1},
              "clear drops the namespace's pages but one being read, resets the counters")
        check(inst.storage.batch_exists(keys) == 1 and not inst.storage.exists(key),
              "after clear: only the page being read is found")
        check(len(other.lookup(list(range(16)), ns="keep", pin=False)) == 1,
              "clear leaves other namespaces alone")
        reader.release([pinned])
        inst.storage.clear()
        check(inst.storage.stats()["last_clear"] == {"cleared": 1, "kept": 0}
              and inst.storage.batch_exists(keys) == 0, "once read, a second clear drops it")
        # delete(key): that page goes (the Evict RPC), unless it is being read.
        check(inst.storage.set(key, page), "set after clear")
        [held] = inst.storage.keys.pin([engines.kvshare.sglang.page_key(key)])
        check(not inst.storage.delete(key) and inst.storage.exists(key),
              "delete keeps a page being read")
        reader.release([held])
        check(inst.storage.delete(key) and not inst.storage.exists(key), "delete drops the page")
        check(inst.storage.delete(key), "delete of a page not stored: nothing left to drop")
        other.close()
    finally:
        d.stop()


def case_sglang_ranks(torch):
    d = daemon()
    try:
        tokens, _ = engines.prompt(91, 2)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        for what, size, rank in (("pipeline", "pp_size", "pp_rank"),
                                 ("attention context-parallel", "attn_cp_size", "attn_cp_rank"),
                                 ("tensor", "tp_size", "tp_rank")):
            ranks = [engines.SglangInstance(d.socket, ns="sglang.ranks", **{size: 2, rank: r})
                     for r in (0, 1)]
            names = [i.storage.ns for i in ranks]
            check(names[0] != names[1], "%s ranks 0 and 1: namespaces %s" % (what, names))
            for r, inst in enumerate(ranks):  # each rank holds other KV for the same tokens
                inst.pool.kv_buffer.uniform_(-1, 1)
                check(inst.store(keys, [0, 1]) == [True, True], "%s rank %d stored its 2 pages"
                      % (what, r))
            for r, inst in enumerate(ranks):
                n, ok = inst.load(keys, [4, 5])
                got, want = inst.read_kv([4, 5]), inst.read_kv([0, 1])
                check(n == 2 and ok == [True, True] and
                      all(same_bytes(torch, a, b) for a, b in zip(got[0] + got[1],
                                                                   want[0] + want[1])),
                      "%s rank %d reads back its own pages, not the other rank's" % (what, r))
        both = engines.SglangInstance(d.socket, ns="sglang.ranks", pp_size=2, pp_rank=1,
                                      attn_cp_size=2, attn_cp_rank=1, tp_size=4, tp_rank=3)
        check(both.storage.ns == "sglang.ranks_tp3_4_pp1_2_cp1_2",
              "all three ranks in the namespace: %s" % both.storage.ns)
    finally:
        d.stop()


def case_sglang_tp2(torch):
    """SGLang with TP=2 on one kvshared --devices 0-1 ("tp_devices": 1): the
    two ranks of engine A store the same pages (each its head) without
    talking to each other; a page is found only once both ranks stored it;
    the ranks of engine B each read back their own head, bitwise; both
    paths (interface_v1 and flat pages)."""
    tp = 2
    d = engines.daemon_tp(ARGS.kvshared, tp)
    try:
        for v1 in (True, False):
            tokens, _ = engines.prompt(95 + v1, 3)
            keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
            a = [engines.SglangInstance(d.socket, ns="sglang.tp", tp_devices=True, tp_size=tp,
                                        tp_rank=r, interface_v1=v1) for r in range(tp)]
            b = [engines.SglangInstance(d.socket, ns="sglang.tp", tp_devices=True, tp_size=tp,
                                        tp_rank=r, interface_v1=v1) for r in range(tp)]
            check(a[0].storage.ns == "sglang.tp" and a[1].storage.ns == "sglang.tp",
                  "the TP ranks share the namespace (%s)" % a[1].storage.ns)
            for inst in a:
                inst.pool.kv_buffer.uniform_(-1, 1)
            check(a[0].store(keys, [0, 1, 2]) == [True] * 3, "rank 0 stored its head of 3 pages")
            check(b[0].load(keys, [4, 5, 6])[0] == 0 and b[1].load(keys, [4, 5, 6])[0] == 0,
                  "with one rank's shard only, no rank finds the pages")
            check(a[1].store(keys, [0, 1, 2]) == [True] * 3, "rank 1 stored its head too")
            st = engines.kvshare.Client(socket_path=d.socket, map_pool=False).stats()
            check(st["writing_blocks"] == 0 and st["pinned_blocks"] == 0,
                  "the pages are cached, nothing WRITING or pinned (%d, %d)"
                  % (st["writing_blocks"], st["pinned_blocks"]))
            for r in range(tp):
                n, ok = b[r].load(keys, [4, 5, 6])
                got, want = b[r].read_kv([4, 5, 6]), a[r].read_kv([0, 1, 2])
                check(n == 3 and ok == [True] * 3 and
                      all(same_bytes(torch, x, y) for x, y in zip(got[0] + got[1],
                                                                  want[0] + want[1])),
                      "%s: engine B's rank %d reads back engine A's rank %d head, bitwise"
                      % ("interface_v1" if v1 else "flat pages", r, r))
            again = a[0].store(keys, [0, 1, 2])
            cached = engines.kvshare.Client(socket_path=d.socket,
                                            map_pool=False).stats()["cached_blocks"]
            check(again == [True] * 3 and cached == (3 if v1 else 6),
                  "storing stored pages again adds nothing (%d cached)" % cached)
        try:
            engines.SglangInstance(d.socket, ns="sglang.tp", tp_devices=True, tp_size=4,
                                   tp_rank=1)
            raise Failure("TP=4 on a kvshared of 2 devices was not refused")
        except engines.kvshare.keyblocks.GeometryMismatch as e:
            print("   " + str(e))
            check("--devices 0-3" in str(e), "TP=4 on 2 devices: refused, the flag named")
    finally:
        d.stop()


def case_sglang_paths(torch):
    d = daemon()
    try:
        tokens, _ = engines.prompt(93, 3)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        a = engines.SglangInstance(d.socket, ns="sglang.paths", interface_v1=False)
        check(not a.v1, "without interface_v1 SGLang uses batch_get/batch_set with flat pages")
        a.write_kv([0, 1, 2], ks, vs)
        check(a.store(keys, [0, 1, 2]) == [True] * 3, "batch_set of 3 flat pages")
        n, ok = a.load(keys, [5, 6, 7])
        got, want = a.read_kv([5, 6, 7]), a.read_kv([0, 1, 2])
        check(n == 3 and ok == [True] * 3 and
              all(same_bytes(torch, x, y) for x, y in zip(got[0] + got[1], want[0] + want[1])),
              "batch_get into flat pages, set_from_flat_data_page: the bytes round-trip")
        b = engines.SglangInstance(d.socket, ns="sglang.paths", metrics=True)
        n, ok = b.load(keys, [1, 2, 3])
        check(n == 3 and ok == [True] * 3, "interface_v1: batch_get_v1 reads the pages the "
              "per-page path stored")
        check(b.collector.observed["prefetch_pgs"] == [3] and
              len(b.collector.observed["prefetch_bandwidth"]) == 1 and
              b.collector.observed["prefetch_bandwidth"][0] > 0,
              "storage metrics on: get_stats() gave a StorageMetrics SGLang's collector took "
              "(%r)" % b.collector.observed)
        b.write_kv([8, 9, 10], ks, vs)
        more = engines.sglang_keys(engines.prompt(94, 2)[0], engines.GEO["block_tokens"])
        check(b.store(more, [8, 9]) == [True, True] and
              b.collector.observed["backup_pgs"] == [2], "a backup of 2 pages is in the metrics")
        check(b.storage.get_stats() == engines.kvshare.sglang.StorageMetrics(),
              "get_stats() drains what it reported")
        c = engines.SglangInstance(d.socket, ns="sglang.paths")
        check(c.load(keys, [1, 2, 3]) == (3, [True] * 3) and
              c.storage.get_stats() == engines.kvshare.sglang.StorageMetrics(),
              "with storage metrics off nothing is kept for get_stats() (it would only grow)")
    finally:
        d.stop()


# -- two instances, two processes ---------------------------------------------

def role_store(engine, socket, outdir):
    """Instance A: computes the prompt, writes its KV in its own cache, stores it."""
    import torch
    torch.set_num_threads(1)
    tokens, _ = engines.prompt(31, engines.torch_share.PROMPT_BLOCKS)
    m = engines.model(torch)
    _, ks, vs = m.prefill(tokens)
    n = len(tokens) // engines.GEO["block_tokens"]
    blocks = list(range(n - 1, -1, -1))  # anywhere in its own cache
    if engine == "vllm":
        inst = engines.VllmInstance(socket)
        inst.write_kv(blocks, ks, vs)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        todo = inst.store(hashes, blocks)
        check(todo is not None and len(todo) == n, "A: stored %d blocks" % n)
        inst.close()
    else:
        inst = engines.SglangInstance(socket)
        inst.write_kv(blocks, ks, vs)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        check(inst.store(keys, blocks) == [True] * n, "A: stored %d pages" % n)
    ak, av = inst.read_kv(blocks)
    torch.save({"k": ak, "v": av}, os.path.join(outdir, "a.pt"))


def role_load(engine, socket, outdir):
    """Instance B: finds the prompt, loads it into its own cache, runs the continuation."""
    import torch
    torch.set_num_threads(1)
    tokens, cont = engines.prompt(31, engines.torch_share.PROMPT_BLOCKS)
    n = len(tokens) // engines.GEO["block_tokens"]
    mine = [5 + 2 * i for i in range(n)]
    if engine == "vllm":
        inst = engines.VllmInstance(socket)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        hits = inst.load(hashes, mine)
        check(hits == n, "B: lookup found all %d blocks, the load succeeded" % n)
        inst.close()
    else:
        inst = engines.SglangInstance(socket)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        hits, ok = inst.load(keys, mine)
        check(hits == n and ok == [True] * n, "B: batch_exists found all %d pages, "
              "batch_get_v1 read them" % n)
    bk, bv = inst.read_kv(mine)
    a = torch.load(os.path.join(outdir, "a.pt"))
    check(all(same_bytes(torch, x, y) for x, y in zip(bk + bv, a["k"] + a["v"])),
          "B's KV tensors equal A's byte for byte")
    m = engines.model(torch)
    m.projected = 0
    shared = m.extend(cont, bk, bv)
    check(m.projected == len(cont) * engines.GEO["layers"],
          "B computed only the %d continuation tokens" % len(cont))
    _, rk, rv = m.prefill(tokens)
    reference = m.extend(cont, rk, rv)
    check(same_bytes(torch, shared, reference),
          "B's attention output on the continuation equals computing the whole prompt "
          "(bitwise; max |out| %.3g)" % reference.abs().max().item())


def run_role(role, engine, socket, outdir):
    cmd = [sys.executable, os.path.abspath(__file__), "--kvshared", ARGS.kvshared,
           "--lib", ARGS.lib, "--role", role, "--engine", engine, "--socket", socket,
           "--outdir", outdir]
    rc = subprocess.run(cmd, timeout=120).returncode
    if rc != 0:
        raise Failure("%s %s exited with %d" % (engine, role, rc))


def two_processes(engine):
    d = daemon()
    out = tempfile.mkdtemp(prefix="kvs-eng-")
    try:
        run_role("store", engine, d.socket, out)
        run_role("load", engine, d.socket, out)
        check(True, "%s: two instances in two processes shared the prompt" % engine)
    finally:
        d.stop()
        for f in os.listdir(out):
            os.unlink(os.path.join(out, f))
        os.rmdir(out)


def case_vllm_two(torch):
    two_processes("vllm")


def case_sglang_two(torch):
    two_processes("sglang")


# -- a vLLM and an SGLang instance on one daemon ------------------------------

def case_cross(torch):
    d = daemon()
    try:
        v = engines.VllmInstance(d.socket, ns="vllm.m")
        s = engines.SglangInstance(d.socket, ns="sglang.m")
        tokens, _ = engines.prompt(41, 3)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        v.write_kv([0, 1, 2], ks, vs)
        check(v.store(hashes, [0, 1, 2]) is not None, "vLLM stored the prompt")
        check(s.storage.batch_exists(keys) == 0, "SGLang does not find it under its own keys")
        check(s.storage.batch_exists([h.hex() for h in hashes]) == 0,
              "nor under vLLM's very key bytes (another namespace)")
        s.write_kv([0, 1, 2], ks, vs)
        check(s.store(keys, [0, 1, 2]) == [True] * 3, "SGLang stored the same prompt itself")
        check(v.lookup([bytes.fromhex(k) for k in keys]) == 0,
              "vLLM does not find SGLang's pages")
        check(v.lookup(hashes) == 3 and s.storage.batch_exists(keys) == 3,
              "each finds its own")
        c = v.manager.core.client
        rv, rs = engines.ns_row(c, "vllm.m"), engines.ns_row(c, "sglang.m")
        check(rv["cached_blocks"] == 3 and rs["cached_blocks"] == 3 and
              c.stats()["cached_blocks"] == 6, "3 blocks in each namespace, 6 in the pool")
        v.close()
    finally:
        d.stop()


# -- model identity: default namespaces, Hello, the hash seed ---------------------

class Records(logging.Handler):
    """The kvshare plug-ins' log records while installed."""

    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def __enter__(self):
        logging.getLogger("kvshare").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("kvshare").removeHandler(self)


def case_identity(torch):
    """Regression: every model got the namespace "vllm" (or "sglang") by
    default, so a fine-tune found its base model's blocks under equal keys
    (equal hash seeds, as sharing needs) and would load the wrong KV. Now
    the default namespace comes from the model's identity, each plug-in
    declares that identity in Hello, and kvshared refuses a namespace that
    holds another model's KV; the plug-in then misses, it does not fail."""
    v, kb = engines.kvshare.vllm, engines.kvshare.keyblocks
    bt = engines.GEO["block_tokens"]
    base, tuned = "org/base-7b", "org/base-7b-finetune"
    d = daemon()
    opened = []
    try:
        tokens, _ = engines.prompt(101, 2)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        hashes = engines.vllm_hashes(tokens, bt)

        def vllm(**kw):
            opened.append(engines.VllmInstance(d.socket, **kw))
            return opened[-1]
        a = vllm(ns=None, model=base, revision="r1")
        ns = a.spec.ns
        check(ns.startswith("vllm-base-7b-") and len(ns) == len("vllm-base-7b-") + 12,
              "vLLM, no namespace configured: one from the model (%s)" % ns)
        text, _ = a.manager.core.client.identity()
        check("model=%s" % base in text and "revision=r1" in text and "fp32" in text,
              "the plug-in declared the model in Hello: %s" % text)
        a.write_kv([0, 1], ks, vs)
        check(a.store(hashes, [0, 1]) == [engines.vllm_key(h) for h in hashes],
              "the base model stored a prompt of 2 blocks")
        b = vllm(ns=None, model=tuned, revision="r1")
        check(b.spec.ns != ns and b.spec.ns.startswith("vllm-base-7b-finetune-"),
              "its fine-tune, no namespace configured: another one (%s)" % b.spec.ns)
        check(b.lookup(hashes, req="b") == 0,
              "the fine-tune does not find the base model's blocks under the same keys")
        b.finish("b")
        a2 = vllm(ns=None, model=base, revision="r1")
        check(a2.spec.ns == ns, "a second instance of the base model: the same namespace")
        check(a2.load(hashes, [4, 5], req="a2") == 2, "it finds and loads the 2 blocks")
        got, want = a2.read_kv([4, 5]), a.read_kv([0, 1])
        check(all(same_bytes(torch, x, y) for x, y in zip(got[0] + got[1], want[0] + want[1])),
              "the bytes are the base model's")
        other = vllm(ns=None, model=base, revision="r2")
        check(other.spec.ns != ns, "another revision: another namespace (%s)" % other.spec.ns)

        # Configured into the base model's namespace: refused by the daemon,
        # logged once, and a cache that always misses.
        with Records() as log:
            c = vllm(ns=ns, model=tuned)
            refused = c.manager.core.keys.refused
            check(isinstance(refused, engines.kvshare.KvsError) and
                  refused.status == engines.kvshare.STATUS["EIDENTITY"],
                  "the fine-tune configured into the base model's namespace: kvshared "
                  "refused it (%s)" % refused)
            check(c.lookup(hashes, req="c") == 0, "its lookups miss, nothing raises")
            c.finish("c")
            check(c.store(hashes, [0, 1], req="c") is None, "its stores are declined")
            check(c.finished() == [] and c.core.counts["load_unserved"] == 0,
                  "no transfer failed")
        msgs = [r.getMessage() for r in log.records]
        check(len(msgs) == 1 and "KVS_EIDENTITY" in msgs[0] and "always misses" in msgs[0]
              and "model=%s'" % base in msgs[0] and "model=%s'" % tuned in msgs[0],
              "logged once, naming both models: %s" % msgs)
        check(a2.lookup(hashes, req="a3") == 2, "the base model's blocks are untouched")
        a2.finish("a3")

        # SGLang: the same, by its model_name and the host pool's layout.
        keys = engines.sglang_keys(tokens, bt)
        sa = engines.SglangInstance(d.socket, ns=None, model=base)
        sns = sa.storage.ns
        check(sns.startswith("sglang-base-7b-") and sns != ns,
              "SGLang, no namespace configured: one from the model (%s)" % sns)
        check("model=%s" % base in sa.storage.client.identity()[0],
              "SGLang declared the model in Hello")
        sa.write_kv([0, 1], ks, vs)
        check(sa.store(keys, [0, 1]) == [True, True], "SGLang's base model stored 2 pages")
        sb = engines.SglangInstance(d.socket, ns=None, model=tuned)
        check(sb.storage.ns != sns and sb.storage.batch_exists(keys) == 0,
              "SGLang's fine-tune: another namespace (%s), the pages not found"
              % sb.storage.ns)
        sa2 = engines.SglangInstance(d.socket, ns=None, model=base)
        check(sa2.storage.ns == sns and sa2.load(keys, [4, 5]) == (2, [True, True]),
              "a second SGLang instance of the base model finds and reads them")
        with Records() as log:
            sc = engines.SglangInstance(d.socket, ns=sns, model=tuned)
            check(sc.storage.batch_exists(keys) == 0 and
                  sc.store(keys, [0, 1]) == [False, False] and
                  sc.storage.batch_get_v1(keys, sc.indices([2, 3])) == [False, False],
                  "SGLang configured into another model's namespace: misses, declined "
                  "stores, nothing raises")
            check("KVS_EIDENTITY" in sc.storage.stats().get("refused", ""),
                  "stats() says why")
        check(len(log.records) == 1, "logged once (%d)" % len(log.records))
        check(sa2.storage.batch_exists(keys) == 2, "the base model's pages are untouched")
    finally:
        for inst in opened:
            inst.close()
        d.stop()


def case_hash_seed(torch):
    """A vLLM configuration in which no two instances could share a block is
    refused at start, saying what to set: PYTHONHASHSEED unset (vLLM roots
    its hashes in os.urandom), and the releases' builtin hash algorithm."""
    v = engines.kvshare.vllm
    d = daemon()
    seed = os.environ.pop("PYTHONHASHSEED")
    try:
        try:
            engines.VllmInstance(d.socket, ns=None, model="org/m")
            raise Failure("vLLM without PYTHONHASHSEED was not refused")
        except v.HashSeedRefused as e:
            print("   " + str(e))
            check("PYTHONHASHSEED is not set" in str(e) and "PYTHONHASHSEED=0" in str(e),
                  "PYTHONHASHSEED unset: refused at start, saying what to set")
        os.environ["PYTHONHASHSEED"] = "random"
        inst = engines.VllmInstance(d.socket, ns=None, model="org/m")
        check(True, "PYTHONHASHSEED=random with a sha256 algorithm: vLLM hashes the text "
              "itself, the same in every process: accepted")
        inst.close()
        if engines.LAYOUT != "newest":
            for value in ("random", "0"):
                os.environ["PYTHONHASHSEED"] = value
                try:
                    engines.VllmInstance(d.socket, ns=None, model="org/m", hash_algo="builtin")
                    raise Failure("vLLM's builtin hash algorithm was not refused")
                except v.HashSeedRefused as e:
                    print("   " + str(e))
                    check("--prefix-caching-hash-algo sha256_cbor" in str(e),
                          "the builtin hash algorithm (PYTHONHASHSEED=%s): refused, the "
                          "option named" % value)
        c = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        check(c.stats()["sessions"] == 1, "a refused plug-in left no session behind")
        c.close()
    finally:
        os.environ["PYTHONHASHSEED"] = seed
        d.stop()


# -- failure paths ---------------------------------------------------------------

def case_daemon_down(torch):
    gone = os.path.join(tempfile.gettempdir(), "kvs-no-daemon-%d.sock" % os.getpid())
    v = engines.VllmInstance(gone)
    s = engines.SglangInstance(gone)
    tokens, _ = engines.prompt(51, 2)
    hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
    keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
    check(v.lookup(hashes) == 0, "vLLM without a daemon: lookup is a miss (0)")
    check(v.prepare_store(hashes) is None, "vLLM without a daemon: prepare_store declines (None)")
    check(s.storage.batch_exists(keys) == 0 and s.store(keys, [0, 1]) == [False, False],
          "SGLang without a daemon: batch_exists 0, batch_set_v1 all False")
    v.close()
    # A daemon that comes, serves, and goes.
    d = daemon()
    v = engines.VllmInstance(d.socket)
    m = engines.model(torch)
    _, ks, vs = m.prefill(tokens)
    v.write_kv([0, 1], ks, vs)
    check(v.store(hashes, [0, 1]) is not None and v.lookup(hashes, req="a") == 2,
          "stored with a daemon")
    v.finish("a")
    d.stop()
    check(v.lookup(hashes, req="b") == 0, "the daemon gone: lookup is a miss again")
    check(v.prepare_store(hashes, req="b") is None, "and prepare_store declines")
    v.finish("b")
    check(v.core.counts["load_unserved"] == 0, "no transfer failed")
    v.close()


def case_evicted(torch):
    d = daemon()
    try:
        s = engines.SglangInstance(d.socket)
        tokens, _ = engines.prompt(61, 3)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        s.write_kv([0, 1, 2], ks, vs)
        check(s.store(keys, [0, 1, 2]) == [True] * 3, "SGLang stored the prompt")
        check(s.storage.batch_exists(keys) == 3, "batch_exists finds it")
        # Another worker takes the whole pool: every unpinned block is evicted.
        with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as hog:
            got = hog.alloc(engines.POOL_BLOCKS)
            check(len(got) == engines.POOL_BLOCKS and hog.stats()["cached_blocks"] == 0,
                  "another worker's alloc of the whole pool evicted them")
            got = s.storage.batch_get_v1(keys, s.indices([5, 6, 7]))
            check(got == [False] * 3, "batch_get_v1 says False for each page (SGLang's miss)")
    finally:
        d.stop()


def role_victim(engine, socket, outdir):
    """Holds lookup pins of 2 blocks and a store of 3 blocks held mid-copy
    (WRITING blocks of its worker), and waits to be killed."""
    import time
    inst = engines.VllmInstance(socket)
    hashes = hashes_of(71, 2)
    check(inst.lookup(hashes) == 2, "victim: 2 blocks found and pinned by the lookup")
    more = hashes_of(72, 3)
    out = inst.prepare_store(more)
    check(out is not None and len(inst.todo(out)) == 3, "victim: 3 blocks to store")
    src = engines.gpu_spec([0, 1, 2])
    src.block_ids = Gate([0, 1, 2])  # never opened: the copy waits
    inst.submit(False, src, out.store_spec)
    with engines.kvshare.Client(socket_path=socket, map_pool=False) as c:
        check(engines.wait_for(lambda: c.stats()["writing_blocks"] == 3),
              "victim: its worker allocated 3 blocks")
    print("IN FLIGHT", flush=True)
    time.sleep(3600)


def case_killed(torch):
    d = daemon()
    try:
        v = engines.VllmInstance(d.socket)
        tokens, _ = engines.prompt(71, 2)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        v.write_kv([0, 1], ks, vs)
        check(v.store(engines.vllm_hashes(tokens, engines.GEO["block_tokens"]), [0, 1])
              is not None, "a prompt of 2 blocks stored")
        cmd = [sys.executable, os.path.abspath(__file__), "--kvshared", ARGS.kvshared,
               "--lib", ARGS.lib, "--role", "victim", "--engine", "vllm",
               "--socket", d.socket, "--outdir", "-"]
        tmp = tempfile.mkdtemp(prefix="kvs-victim-")  # its state file: it cannot clean up
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, TMPDIR=tmp))
        line = ""
        while line.strip() != "IN FLIGHT":
            line = p.stdout.readline()
            if not line:
                raise Failure("the victim exited before its transfer: %s" % p.wait())
            print(line.rstrip())
        c = v.manager.core.client
        st = c.stats()
        check(st["pinned_blocks"] == 2 and st["writing_blocks"] == 3,
              "while it runs: 2 blocks pinned, 3 WRITING")
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        shutil.rmtree(tmp)
        check(engines.wait_for(lambda: c.stats()["pinned_blocks"] == 0 and
                               c.stats()["writing_blocks"] == 0),
              "killed mid-transfer: the daemon freed its pins and WRITING blocks")
        check(v.lookup(engines.vllm_hashes(tokens, engines.GEO["block_tokens"])) == 2,
              "the stored prompt is still there")
        v.finish("r")
        v.close()
    finally:
        d.stop()


def case_geometry(torch):
    d = daemon()
    try:
        for what, kw in (("head_dim 64", {"head_dim": 64}), ("3 layers", {"layers": 3}),
                         ("blocks of 32 tokens", {"block_size": 32})):
            try:
                engines.VllmInstance(d.socket, **kw)
                raise Failure("vLLM with %s was not refused" % what)
            except engines.kvshare.keyblocks.GeometryMismatch as e:
                msg = str(e)
                print("   " + msg)
                check("engine's KV layout" in msg and "pool's (2 layers x 2 kv heads x 32 head "
                      "dim, fp32, 16 tokens per block" in msg,
                      "vLLM with %s: refused at start, both layouts named" % what)
        try:
            engines.VllmInstance(d.socket, world_size=2)
            raise Failure("vLLM with 2 workers was not refused")
        except engines.kvshare.keyblocks.GeometryMismatch as e:
            print("   " + str(e))
            if engines.LAYOUT == "newest":
                check("2 tensor-parallel workers and kvshared serves 1 device" in str(e) and
                      "--devices 0-1" in str(e),
                      "vLLM with 2 tensor-parallel workers, kvshared of one device: refused at "
                      "start, the flag named")
            else:
                check("2 workers" in str(e), "vLLM with 2 workers: refused at start")
        try:
            engines.SglangInstance(d.socket, head_dim=16)
            raise Failure("SGLang with head_dim 16 was not refused")
        except engines.kvshare.keyblocks.GeometryMismatch as e:
            print("   " + str(e))
            check("16 head dim" in str(e) and "32 head dim" in str(e),
                  "SGLang with head_dim 16: refused at register_mem_pool_host, both named")
        c = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        check(c.stats()["cached_blocks"] == 0 and c.stats()["writing_blocks"] == 0,
              "nothing was stored by the refused plug-ins")
        c.close()
    finally:
        d.stop()


def case_vllm_tp2(torch):
    """A vLLM engine with TP=2 (one scheduler, two workers each holding one of
    the two KV heads) against one kvshared --devices 0-1: engine A stores a
    prompt, engine B finds it with one lookup per key by its scheduler and
    each of B's workers loads its own head, bitwise A's; a store one rank
    could not make leaves nothing cached, and the scheduler gives its
    blocks back in one Release at its next call; complete_store makes no
    RPC on the scheduler's step (regression: one Lookup per key)."""
    if engines.LAYOUT != "newest":
        print("   skipped: the releases' interface names no rank, so the plug-in refuses "
              "tensor parallelism there (case geometry checks the refusal)")
        return
    tp = 2
    d = engines.daemon_tp(ARGS.kvshared, tp)
    try:
        a = engines.VllmGroup(d.socket, tp, ns="vllm.tp")
        tokens, _ = engines.prompt(71, 4)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        a.write_kv([3, 4, 9, 10], ks, vs)
        check(a.lookup(hashes) == 0, "a new prompt: no block")
        a.finish("r")
        keys = [engines.vllm_key(h) for h in hashes]
        c = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        out = a.prepare_store(hashes, req="s")
        check(a.todo(out) == keys, "prepare_store asks for 4 blocks")
        a.wait_job(a.submit(False, engines.gpu_spec([3, 4, 9, 10]), out.store_spec))
        rpcs = step_rpcs(a, c, lambda: a.complete_store(keys, req="s"))
        check(rpcs == 0, "both workers stored their head; complete_store of the group made no "
              "RPC on the scheduler's step (%d)" % rpcs)
        a.finish("s")
        check(wait_events(a) == [keys], "one stored event with the 4 keys (not one per rank)")
        st = a.manager.core.client.stats()
        check(st["writing_blocks"] == 0 and st["pinned_blocks"] == 0 and
              st["cached_blocks"] == 4,
              "4 blocks cached, nothing WRITING or pinned (%d/%d/%d)" %
              (st["cached_blocks"], st["writing_blocks"], st["pinned_blocks"]))
        check([x["workers"] for x in st["devices"]] == [2, 2],
              "each device has its rank's two sessions of engine A (copies, pool)")

        b = engines.VllmGroup(d.socket, tp, ns="vllm.tp")
        before = b.manager.core.client.stats()["requests"]
        check(b.load(hashes, [0, 1, 12, 13], req="b") == 4,
              "engine B: lookup, prepare_load, both workers' transfers, complete_load")
        got_k, got_v = b.read_kv([0, 1, 12, 13])
        check(all(same_bytes(torch, x, y) for x, y in zip(got_k + got_v, ks + vs)),
              "B's two workers hold exactly A's KV, each its own head")
        per_lookup = b.manager.core.client.stats()["requests"] - before
        check(b.manager.core.counts["lookups"] == 8,
              "B's scheduler asked once per key and step for the group (%d lookups, %d RPCs "
              "by then)" % (b.manager.core.counts["lookups"], per_lookup))

        # Rank 1 cannot store (vLLM lets it report no failure): nothing of
        # that store is cached, and the scheduler's blocks go back.
        other, _ = engines.prompt(72, 2)
        oh = engines.vllm_hashes(other, engines.GEO["block_tokens"])
        _, ks2, vs2 = m.prefill(other)
        a.write_kv([5, 6], ks2, vs2)
        a.workers[1].core._store_shard = lambda *args: 0
        okeys = [engines.vllm_key(h) for h in oh]
        out = a.prepare_store(oh, req="s2")
        check(a.todo(out) == okeys, "prepare_store asked for 2 blocks")
        a.wait_job(a.submit(False, engines.gpu_spec([5, 6]), out.store_spec))
        del a.workers[1].core._store_shard
        check(c.stats()["writing_blocks"] == 2, "rank 1 stored nothing: 2 blocks WRITING")
        # Regression: complete_store looked each key up on the scheduler's
        # step (one Lookup RPC per key) to give back what stayed uncached.
        rpcs = step_rpcs(a, c, lambda: a.complete_store(okeys, req="s2"))
        check(rpcs == 0, "complete_store made no RPC on the scheduler's step (%d)" % rpcs)
        a.finish("s2")
        check(engines.wait_for(a.manager.core.finder.idle),
              "the plug-in's own thread looked the 2 keys up")
        rpcs = step_rpcs(a, c, a.events)
        check(rpcs == 1, "the scheduler's next call gave both blocks back in one RPC (%d)" % rpcs)
        st = c.stats()
        check(b.lookup(oh, req="c") == 0 and st["writing_blocks"] == 0 and
              st["cached_blocks"] == 4 and a.events() == [],
              "a block one rank did not write is never served; nothing left WRITING")
        b.finish("c")
        c.close()
        b.close()
        a.close()
        st = engines.kvshare.Client(socket_path=d.socket, map_pool=False).stats()
        check(st["writing_blocks"] == 0 and st["pinned_blocks"] == 0,
              "both engines gone: nothing held")
    finally:
        d.stop()


def step_rpcs(inst, c, call):
    """RPCs kvshared served during call(), counted by its requests counter
    through client c (less c's own Stats). The plug-in's finder thread
    (its own session) is held back meanwhile: what it is given waits until
    call() has returned, so only the scheduler's RPCs count."""
    finder = getattr(inst.manager.core, "finder", None)
    held = []
    if finder is not None:
        finder.put = lambda *args, **kw: held.append((args, kw))
    try:
        before = c.stats()["requests"]
        call()
        return c.stats()["requests"] - before - 1
    finally:
        if finder is not None:
            del finder.put
            for args, kw in held:
                finder.put(*args, **kw)


def case_copier(torch):
    import random
    from kvshare.tensors import BlockCopier
    rng = random.Random(5)
    row, eng_blocks, pool_blocks = 96, 24, 20
    for factor in (1, 2):
        for method in BlockCopier.METHODS:
            # Engine rows with a gap after each (a page holding K then V, as
            # vLLM's joined layout), pool rows back to back.
            pages = [torch.randint(0, 255, (eng_blocks, 2 * row), dtype=torch.uint8)
                     for _ in range(3)]
            engine = [p[:, :row] for p in pages]
            pool = [torch.zeros(pool_blocks, factor * row, dtype=torch.uint8) for _ in range(3)]
            copier = BlockCopier(list(zip(engine, pool)), factor=factor, method=method)
            n = 6
            for shape in ("runs", "scattered"):
                if shape == "runs":
                    src = [2, 3, 4, 5, 11, 12][:n * factor]
                    dst = [7, 8, 9][:n // factor] if factor == 2 else [7, 8, 9, 14, 15, 16]
                else:
                    src = rng.sample(range(eng_blocks), n)
                    dst = rng.sample(range(pool_blocks), n // factor)
                copier.store(src, dst)
                fine = [b * factor + j for b in dst for j in range(factor)]
                check(all(same_bytes(torch, p.view(-1, row)[fine], e[src])
                          for e, p in zip(engine, pool)),
                      "%s, factor %d, %s: store" % (method, factor, shape))
                stored = [e[src].clone() for e in engine]
                back = rng.sample(range(eng_blocks), len(src))
                copier.load(dst, back)
                check(all(same_bytes(torch, e[back], want) for e, want in zip(engine, stored)),
                      "%s, factor %d, %s: load" % (method, factor, shape))
            before = [p.clone() for p in pool]
            try:
                copier.store([0, eng_blocks], [1] if factor == 2 else [1, 2])
                raise Failure("%s: an engine block out of range was copied" % method)
            except ValueError as e:
                check("out of range" in str(e) and all(torch.equal(a, b)
                                                       for a, b in zip(before, pool)),
                      "%s, factor %d: out of range refused, nothing copied (%s)"
                      % (method, factor, e))



# -- a hung daemon, a restart mid-batch, events off, the copy stream ----------

FAST_S = 0.05  # the bound of the issue: every call after the first timeout


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return time.monotonic() - t0, out


def case_hung(torch):
    """Regression: a hung daemon (SIGSTOP) cost every call its full timeout
    (a lookup 1 s, get_finished 2 s, SGLang's batch calls 1 s each). With
    the client's circuit breaker, after the first timeout each call of the
    scheduler, the worker and SGLang returns within 50 ms, with the engine's
    own failure values; once the daemon runs again, both recover."""
    d = daemon()
    stopped = False
    try:
        v = engines.VllmInstance(d.socket, ns="vllm.hung", timeout_ms=300)
        sg = engines.SglangInstance(d.socket, ns="sglang.hung", timeout_ms=300)
        tokens, _ = engines.prompt(91, 2)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        v.write_kv([0, 1], ks, vs)
        sg.write_kv([0, 1], ks, vs)
        check(v.store(hashes, [0, 1]) is not None and sg.store(keys, [0, 1]) == [True, True],
              "stored with the daemon healthy")
        fresh = hashes_of(92, 2)
        fresh_keys = engines.sglang_keys(engines.prompt(92, 2)[0], engines.GEO["block_tokens"])
        os.kill(d.proc.pid, signal.SIGSTOP)
        stopped = True
        job = [None]

        def worker_step():
            if job[0] is None:  # a store submitted to the hung daemon, once
                out = v.prepare_store(fresh, req="w")
                if out is not None:
                    job[0] = v.submit(False, engines.gpu_spec([2, 3]), out.store_spec)
            return v.finished()
        calls = [("vLLM scheduler: lookup", lambda: v.lookup(fresh, req="h", repeat=1)),
                 ("vLLM scheduler: prepare_store", lambda: v.prepare_store(fresh, req="h")),
                 ("vLLM scheduler: complete_store",
                  lambda: v.complete_store([engines.vllm_key(h) for h in fresh], req="h")),
                 ("vLLM scheduler: take_events", v.events),
                 ("vLLM worker: get_finished", worker_step),
                 ("SGLang: batch_exists", lambda: sg.storage.batch_exists(keys)),
                 ("SGLang: batch_get_v1", lambda: sg.storage.batch_get_v1(
                     keys, sg.indices([4, 5]))),
                 ("SGLang: batch_set_v1", lambda: sg.storage.batch_set_v1(
                     fresh_keys, sg.indices([2, 3])))]
        for name, fn in calls:  # each client trips once: at most one timeout each
            fn()
        worst = {}
        for _ in range(5):
            for name, fn in calls:
                t, _ = timed(fn)
                worst[name] = max(worst.get(name, 0.0), t)
        for name, t in worst.items():
            check(t < FAST_S, "hung daemon, after the first timeout: %s returns in %.1f ms "
                  "(< %d ms)" % (name, t * 1000, FAST_S * 1000))
        check(v.lookup(hashes, req="h2", repeat=1) == 0 and
              sg.storage.batch_exists(keys) == 0 and
              sg.storage.batch_get_v1(keys, sg.indices([4, 5])) == [False, False],
              "the engines' own failure values: a miss, 0 pages, False per page")
        v.finish("h2")
        os.kill(d.proc.pid, signal.SIGCONT)
        stopped = False
        check(steps_until(v, lambda: found(v, hashes, "back")),
              "vLLM: the daemon runs again, lookups hit again")
        check(engines.wait_for(lambda: sg.storage.batch_exists(keys) == 2),
              "SGLang: the daemon runs again, batch_exists finds the pages again")
        check(v.core.counts["load_unserved"] == 0, "no transfer failed")
        v.close()
    finally:
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
        d.stop()


class HeldCopier:
    """The storage's copier, whose copies wait for open(): a batch held
    mid-copy."""

    def __init__(self, storage):
        self.storage = storage
        self.real = storage._copier
        self.entered = threading.Event()
        self.gate = threading.Event()
        storage._copier = self._copier

    def _copier(self):
        copier = self.real()
        held = self

        class Held:
            pairs = copier.pairs

            def load(self, *a, **kw):
                held.entered.set()
                held.gate.wait(30)
                return copier.load(*a, **kw)

            def store(self, *a, **kw):
                held.entered.set()
                held.gate.wait(30)
                return copier.store(*a, **kw)
        return Held()

    def remove(self):
        del self.storage._copier


def case_sglang_restart(torch):
    """Regression: kvshared restarting while batch_get_v1 or batch_set_v1
    was copying raised KvsError KVS_ENOTHELD from the plug-in's release into
    SGLang's storage thread (which catches only queue.Empty: HiCache's
    storage layer ended for the process). Now nothing is raised, the batch
    answers False where it could not be done, and the next call works."""
    d = daemon()
    daemons = [d]
    try:
        sg = engines.SglangInstance(d.socket, ns="sglang.restart")
        tokens, _ = engines.prompt(93, 4)
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        sg.write_kv([0, 1, 2, 3], ks, vs)
        check(sg.store(keys[:2], [0, 1]) == [True, True], "2 pages stored")
        for op in ("batch_get_v1", "batch_set_v1"):
            held = HeldCopier(sg.storage)
            out = {}

            def run():
                try:
                    if op == "batch_get_v1":
                        out["r"] = sg.storage.batch_get_v1(keys[:2], sg.indices([6, 7]))
                    else:
                        out["r"] = sg.storage.batch_set_v1(keys[2:], sg.indices([2, 3]))
                except BaseException as e:  # noqa: BLE001 - what SGLang's thread would see
                    out["e"] = e
            t = threading.Thread(target=run)
            t.start()
            check(held.entered.wait(10), "%s is copying" % op)
            time.sleep(2.5 * engines.kvshare.vllm.SAME_DAEMON_MS / 1000)
            daemons.append(restart_daemon(daemons[-1], d.socket))
            held.gate.set()
            t.join(30)
            held.remove()
            check("e" not in out and isinstance(out.get("r"), list) and len(out["r"]) == 2,
                  "kvshared restarted while %s was copying: nothing raised (%r)" % (op, out))
            check(engines.wait_for(lambda: sg.store(keys[:2], [0, 1]) == [True, True] and
                                   sg.storage.batch_exists(keys[:2]) == 2),
                  "after the restart during %s: the next calls work (stored, found)" % op)
        print("   failures counted: %s" % sg.storage.stats()["failures"])
    finally:
        for x in daemons:
            x.stop()


def case_events_off(torch):
    """Regression: with vLLM's KV events off (vLLM's default) complete_store
    queued an event per store that nothing drained, and made one Lookup RPC
    per key on the scheduler's step to build it. Now: nothing is queued and
    complete_store makes no RPC; with events on, the stored event comes."""
    d = daemon()
    try:
        c = engines.kvshare.Client(socket_path=d.socket, map_pool=False)
        for events in (False, True):
            inst = engines.VllmInstance(d.socket, ns="vllm.events.%d" % events, events=events)
            hashes = hashes_of(94 + events, 3)
            out = inst.prepare_store(hashes, req="e")
            todo = inst.todo(out)
            inst.wait_job(inst.submit(False, engines.gpu_spec([0, 1, 2]), out.store_spec))
            rpcs = step_rpcs(inst, c, lambda: inst.complete_store(todo, req="e"))
            inst.finish("e")
            if not events:
                check(rpcs == 0, "events off: complete_store of 3 keys made no RPC (%d)" % rpcs)
                check(inst.manager.core.events is None and inst.events() == [],
                      "events off: nothing queued, take_events empty")
            else:
                check(rpcs == 0, "events on: complete_store itself made no RPC on the "
                      "scheduler's step (%d)" % rpcs)
                check(wait_events(inst) == [todo], "events on: one stored event with the 3 "
                      "keys, found by the plug-in's own thread")
            inst.close()
        c.close()
    finally:
        d.stop()


class FakeCuda:
    """A recording stand-in for torch.cuda's streams and events (no GPU
    here): what StreamOrder records and waits for, in order, with the
    thread that did it."""

    def __init__(self):
        self.log = []
        self.n = 0
        fake = self

        class Event:
            def __init__(self):
                fake.n += 1
                self.id = fake.n

            def record(self, stream):
                fake.log.append(("record", self.id, stream.name,
                                 threading.current_thread().name))

            def synchronize(self):
                fake.log.append(("synchronize", self.id, None, threading.current_thread().name))

        class Stream:
            def __init__(self, device=None, name="copy"):
                self.name = name

            def wait_event(self, event):
                fake.log.append(("wait", event.id, self.name, threading.current_thread().name))
        self.Event, self.Stream = Event, Stream
        self.engine = Stream(name="engine")

    def current_stream(self, device=None):
        return self.engine

    def stream(self, s):
        import contextlib
        fake = self

        @contextlib.contextmanager
        def ctx():
            fake.log.append(("copy begins", None, s.name, threading.current_thread().name))
            yield
            fake.log.append(("copy ends", None, s.name, threading.current_thread().name))
        return ctx()


def case_stream_order(torch):
    """GPU copies ordered against the engine's stream by CUDA events (as
    vLLM's CPU offloader), on a recording stand-in driver: at submit, an
    event recorded on the engine's stream in the engine's thread; the copy
    stream waits for it before the copy; an event recorded after the copy
    is synchronized before the job is reported (and a store committed). The
    copies themselves run on CPU tensors here; that they overlap the
    engine's kernels on a GPU needs a device."""
    from kvshare.tensors import StreamOrder
    d = daemon()
    try:
        inst = engines.VllmInstance(d.socket, ns="vllm.stream")
        fake = FakeCuda()
        inst.core.order = StreamOrder(fake, "cuda:0")
        tokens, _ = engines.prompt(97, 2)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        inst.write_kv([0, 1], ks, vs)
        check(inst.store(hashes, [0, 1]) is not None, "stored through the stand-in streams")
        check(inst.load(hashes, [5, 6], req="l") == 2, "loaded through them")
        got, want = inst.read_kv([5, 6]), inst.read_kv([0, 1])
        check(all(same_bytes(torch, a, b) for a, b in zip(got[0] + got[1], want[0] + want[1])),
              "the bytes are intact")
        me = threading.current_thread().name
        kinds = [(k, s, t == me) for k, _, s, t in fake.log]
        one = [("record", "engine", True), ("wait", "copy", False),
               ("copy begins", "copy", False), ("copy ends", "copy", False),
               ("record", "copy", False), ("synchronize", None, False)]
        check(kinds == one + one, "per job: the engine stream's event recorded in the engine's "
              "thread at submit, the copy stream waits for it, copies, records its own, and "
              "the copy thread synchronizes that event (%r)" % kinds)
        ids = [i for _, i, _, _ in fake.log]
        check(ids[0] == ids[1] and ids[4] == ids[5] and ids[6] == ids[7],
              "the copy stream waits for the very event recorded at submit")
        inst.close()
    finally:
        d.stop()


def case_tp_nodes(torch):
    """Regression: a tensor-parallel group whose ranks are on several nodes
    missed every lookup silently (each rank's state file is local). Now a
    rank whose group's other ranks do not show up on its node refuses to
    start, saying why."""
    if engines.LAYOUT != "newest":
        print("   skipped: tensor parallelism is refused at start with this interface "
              "(case geometry)")
        return
    d = engines.daemon_tp(ARGS.kvshared, 2)
    try:
        state = tempfile.mkdtemp(prefix="kvs-tp-nodes-")
        cfg = engines.vllm_configs(d.socket, "vllm.tpn", os.path.join(state, "pools"),
                                   world_size=2, rank=0, kv_heads=engines.GEO["kv_heads"] // 2,
                                   extra_keys={"group_wait_s": 0.5})
        spec = engines.OffloadingSpecFactory.create_spec(cfg)
        t = torch.zeros(4, 64, dtype=torch.int8)
        vb = engines.vbase
        caches = vb.CanonicalKVCaches(
            tensors=[vb.CanonicalKVCacheTensor(tensor=t, page_size_bytes=64)],
            group_data_refs=[[vb.CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=64)]])
        try:
            spec.get_worker(caches)
            raise Failure("a rank whose group is on several nodes was not refused")
        except engines.kvshare.keyblocks.GeometryMismatch as e:
            print("   " + str(e))
            check("several nodes" in str(e) and "rank 1" in str(e),
                  "rank 0 alone on its node: refused at start, the missing rank named")
        shutil.rmtree(state, True)
    finally:
        d.stop()


CASES = ["signatures", "vllm_order", "vllm_tp2", "vllm_no_fail", "vllm_preempt", "sglang_order", "sglang_ranks", "sglang_tp2",
         "sglang_paths", "vllm_two", "sglang_two", "cross", "daemon_down", "evicted", "killed",
         "geometry", "identity", "hash_seed", "copier", "hung", "sglang_restart", "events_off",
         "stream_order", "tp_nodes"]


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvshared", default=os.environ.get("KVSHARED"))
    p.add_argument("--lib", default=os.environ.get("KVSHARE_LIB"))
    p.add_argument("--only", action="append", choices=CASES)
    p.add_argument("--role", choices=("store", "load", "victim"))
    p.add_argument("--engine", choices=("vllm", "sglang"))
    p.add_argument("--socket")
    p.add_argument("--outdir")
    p.add_argument("--vllm-layout", choices=("newest", "base", "abstract"), default="newest",
                   help="vLLM's interface to load the plug-in through")
    ARGS = p.parse_args()
    if ARGS.lib:
        os.environ["KVSHARE_LIB"] = ARGS.lib
    try:
        import torch
    except ImportError as e:
        print("skipped: PyTorch is not importable by %s: %s" % (sys.executable, e))
        return SKIP
    if ARGS.role:
        try:
            {"store": role_store, "load": role_load, "victim": role_victim}[ARGS.role](
                ARGS.engine, ARGS.socket, ARGS.outdir)
        except (Failure, AssertionError, engines.kvshare.KvsError) as e:
            print("%s: FAILED: %s" % (ARGS.role, e), flush=True)
            return FAIL
        return PASS
    for name, path in (("kvshared", ARGS.kvshared), ("libkvshare", ARGS.lib)):
        if not path or not os.path.isfile(path):
            print("FAILED: %s not found at %r" % (name, path))
            return FAIL
    torch.set_num_threads(1)
    failed = []
    for name in ARGS.only or CASES:
        print("== %s" % name, flush=True)
        try:
            globals()["case_" + name](torch)
        except (Failure, AssertionError, engines.kvshare.KvsError,
                subprocess.TimeoutExpired) as e:
            print("FAILED (%s): %s" % (name, e), flush=True)
            failed.append(name)
    if failed:
        print("FAILED: %s" % ", ".join(failed))
        return FAIL
    print("PASSED: %d cases" % len(ARGS.only or CASES))
    return PASS


if __name__ == "__main__":
    sys.exit(main())
