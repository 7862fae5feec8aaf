# SPDX-License-Identifier: Apache-2.0
"""The vLLM and SGLang plug-ins (kvshare.vllm, kvshare.sglang) against a real
kvshared (host backend, CPU tensors), through harnesses that make each
engine's calls in its order (engines.py).

    test_engines.py --kvshared PATH --lib PATH [--only NAME ...]

Cases:
  vllm_order      lookup repeated, prepare_load, transfer, complete_load;
                  prepare_store, transfer, complete_store, success and failure;
                  both KV layouts (K and V split, and joined); events
  sglang_order    batch_exists, batch_set_v1, batch_get_v1 with host indices;
                  set/get/exists; get_stats; clear and delete (a page being read stays)
  vllm_two        instance A stores a prompt's KV in one process, instance B in
                  another loads it into its own tensors: the bytes equal A's,
                  and B's attention output on a continuation equals computing
                  the whole prompt itself (bitwise)
  sglang_two      the same with two SGLang instances
  cross           a vLLM and an SGLang instance on one daemon never see each
                  other's blocks, even under the same key bytes
  daemon_down     no daemon: misses, declined stores, no error; a daemon that
                  goes away mid-run: misses again
  evicted         blocks evicted between lookup and load: vLLM's transfer
                  fails (a load error), SGLang's batch_get_v1 says False
  killed          a process killed in the middle of a transfer (pins and
                  WRITING blocks held): the daemon frees everything it held
  geometry        a plug-in whose KV layout differs from the pool's is refused
                  at start, with both layouts in the message
  copier          kvshare.tensors.BlockCopier, each copy method (memmove,
                  index, slices), against indexing by hand: runs and scattered
                  blocks, rows with gaps, pool blocks holding 2 engine blocks;
                  an index out of range is refused before anything is copied

Exit status: 0 passed, 1 failed, 77 skipped (no PyTorch; the reason printed).
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
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

def case_vllm_order(torch):
    d = daemon()
    try:
        for joined in (False, True):
            ns = "vllm.order.%s" % ("joined" if joined else "split")
            print("-- layout: %s" % ("joined (num_blocks, 2, ...)" if joined
                                      else "split K and V"))
            inst = engines.VllmInstance(d.socket, ns=ns, joined=joined)
            tokens, _ = engines.prompt(11, 4)
            hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
            m = engines.model(torch)
            _, ks, vs = m.prefill(tokens)
            inst.write_kv([3, 4, 9, 10], ks, vs)
            check(inst.lookup(hashes) == 0, "lookup of a new prompt: 0 blocks, again and again")

            # A failed store frees its blocks: nothing cached, nothing WRITING.
            todo, ok = inst.store(hashes[:2], [3, 4], fail=True)
            st = inst.manager.keys.client.stats()
            check(todo == hashes[:2] and not ok and st["writing_blocks"] == 0,
                  "complete_store(success=False) frees the WRITING blocks")
            check(inst.lookup(hashes) == 0, "after a failed store, still 0 blocks")

            todo, ok = inst.store(hashes, [3, 4, 9, 10])
            check(ok and todo == hashes, "prepare_store asks for all 4 blocks; stored")
            events = list(inst.manager.take_events())
            check(len(events) == 1 and events[0].block_hashes == hashes and
                  not events[0].removed and events[0].medium == "KVSHARE",
                  "take_events: one stored event with the 4 hashes")
            check(list(inst.manager.take_events()) == [], "events are taken once")
            todo, ok = inst.store(hashes, [3, 4, 9, 10])
            check(ok and todo == [], "prepare_store of stored hashes: nothing to store")
            check(inst.lookup(hashes) == 4, "lookup: all 4 blocks, again and again")
            check(inst.lookup(hashes[2:]) == 2,
                  "lookup from the middle of the chain (after GPU hits): 2 blocks")
            other = engines.vllm_hashes(engines.prompt(12, 2)[0], engines.GEO["block_tokens"])
            check(inst.lookup(hashes[:2] + other) == 2, "lookup stops at the first miss")

            spec = inst.manager.prepare_load(hashes)
            row = engines.ns_row(inst.manager.keys.client, ns)
            check(row["pinned_blocks"] == 4, "prepare_load pins the 4 blocks (%d pinned)"
                  % row["pinned_blocks"])
            ok = inst._run(inst.load_handler, spec,
                           engines.kvshare.vllm.GPULoadStoreSpec([0, 1, 12, 13]))
            inst.manager.complete_load(hashes)
            row = engines.ns_row(inst.manager.keys.client, ns)
            check(ok and row["pinned_blocks"] == 0, "the transfer succeeds; complete_load "
                  "drops the pins")
            got_k, got_v = inst.read_kv([0, 1, 12, 13])
            want_k, want_v = inst.read_kv([3, 4, 9, 10])
            check(all(same_bytes(torch, a, b) for a, b in zip(got_k + got_v, want_k + want_v)),
                  "the loaded blocks equal the stored ones byte for byte")
            hits, ok = inst.load(hashes[1:], [5, 6, 7])
            check(hits == 3 and ok, "load through the harness: lookup, prepare_load, transfer, "
                  "complete_load")
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
        st = inst.storage.get_stats()
        check(st["set_present"] == 3 and st["namespace"]["cached_blocks"] == 4,
              "get_stats: 3 pages were there, 4 cached in the namespace")
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
        st = inst.storage.get_stats()
        check(st["sets"] == 0 and st["last_clear"] == {"cleared": 4, "kept": 1},
              "clear drops the namespace's pages but one being read, resets the counters")
        check(inst.storage.batch_exists(keys) == 1 and not inst.storage.exists(key),
              "after clear: only the page being read is found")
        check(len(other.lookup(list(range(16)), ns="keep", pin=False)) == 1,
              "clear leaves other namespaces alone")
        reader.release([pinned])
        inst.storage.clear()
        check(inst.storage.get_stats()["last_clear"] == {"cleared": 1, "kept": 0}
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
        todo, ok = inst.store(hashes, blocks)
        check(ok and len(todo) == n, "A: stored %d blocks" % n)
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
        hits, ok = inst.load(hashes, mine)
        check(hits == n and ok, "B: lookup found all %d blocks, the load succeeded" % n)
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
        check(v.store(hashes, [0, 1, 2])[1], "vLLM stored the prompt")
        check(s.storage.batch_exists(keys) == 0, "SGLang does not find it under its own keys")
        check(s.storage.batch_exists([h.hex() for h in hashes]) == 0,
              "nor under vLLM's very key bytes (another namespace)")
        s.write_kv([0, 1, 2], ks, vs)
        check(s.store(keys, [0, 1, 2]) == [True] * 3, "SGLang stored the same prompt itself")
        check(v.lookup([bytes.fromhex(k) for k in keys]) == 0,
              "vLLM does not find SGLang's pages")
        check(v.lookup(hashes) == 3 and s.storage.batch_exists(keys) == 3,
              "each finds its own")
        c = v.manager.keys.client
        rv, rs = engines.ns_row(c, "vllm.m"), engines.ns_row(c, "sglang.m")
        check(rv["cached_blocks"] == 3 and rs["cached_blocks"] == 3 and
              c.stats()["cached_blocks"] == 6, "3 blocks in each namespace, 6 in the pool")
        v.close()
    finally:
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
    check(v.manager.prepare_store(hashes) is None, "vLLM without a daemon: prepare_store "
          "declines (None)")
    check(s.storage.batch_exists(keys) == 0 and s.store(keys, [0, 1]) == [False, False],
          "SGLang without a daemon: batch_exists 0, batch_set_v1 all False")
    v.close()
    # A daemon that comes, serves, and goes.
    d = daemon()
    v = engines.VllmInstance(d.socket)
    m = engines.model(torch)
    _, ks, vs = m.prefill(tokens)
    v.write_kv([0, 1], ks, vs)
    check(v.store(hashes, [0, 1])[1] and v.lookup(hashes) == 2, "stored with a daemon")
    d.stop()
    check(v.lookup(hashes) == 0, "the daemon gone: lookup is a miss again")
    spec = v.manager.prepare_load(hashes)
    check(spec.block_ids == [-1, -1], "prepare_load without the daemon marks the blocks missing")
    ok = v._run(v.load_handler, spec, engines.kvshare.vllm.GPULoadStoreSpec([2, 3]))
    v.manager.complete_load(hashes)
    check(not ok, "and the transfer reports a failure: the engine recomputes")
    v.close()


def case_evicted(torch):
    d = daemon()
    try:
        v = engines.VllmInstance(d.socket)
        s = engines.SglangInstance(d.socket)
        tokens, _ = engines.prompt(61, 3)
        m = engines.model(torch)
        _, ks, vs = m.prefill(tokens)
        hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
        keys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        v.write_kv([0, 1, 2], ks, vs)
        s.write_kv([0, 1, 2], ks, vs)
        check(v.store(hashes, [0, 1, 2])[1] and s.store(keys, [0, 1, 2]) == [True] * 3,
              "both stored the prompt")
        check(v.lookup(hashes) == 3 and s.storage.batch_exists(keys) == 3, "both find it")
        # Another worker takes the whole pool: every unpinned block is evicted.
        with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as hog:
            got = hog.alloc(engines.POOL_BLOCKS)
            check(len(got) == engines.POOL_BLOCKS and hog.stats()["cached_blocks"] == 0,
                  "another worker's alloc of the whole pool evicted them")
            spec = v.manager.prepare_load(hashes)
            ok = v._run(v.load_handler, spec, engines.kvshare.vllm.GPULoadStoreSpec([3, 4, 5]))
            v.manager.complete_load(hashes)
            check(spec.block_ids == [-1] * 3 and not ok,
                  "vLLM: prepare_load finds them gone and the transfer fails (a load error)")
            got = s.storage.batch_get_v1(keys, s.indices([5, 6, 7]))
            check(got == [False] * 3, "SGLang: batch_get_v1 says False for each page")

        # prepare_store names the hashes its Alloc evicted, of its namespace
        # only: SGLang's 3 pages (stored first, so evicted first) are not
        # among them.
        check(s.store(keys, [0, 1, 2]) == [True] * 3, "SGLang stores its 3 pages again")
        many, _ = engines.prompt(62, 40)
        many = engines.vllm_hashes(many, engines.GEO["block_tokens"])
        check(v.store(many, [i % 16 for i in range(40)])[1], "vLLM stores 40 blocks")
        with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as hog:
            hog.alloc(engines.POOL_BLOCKS - 44)  # 1 block left free
            new, _ = engines.prompt(63, 5)
            new = engines.vllm_hashes(new, engines.GEO["block_tokens"])
            out = v.manager.prepare_store(new)
            check(out is not None and list(out.block_hashes_to_store) == new,
                  "prepare_store of 5 new blocks with 1 free")
            check(list(out.block_hashes_evicted) == many[:1],
                  "block_hashes_evicted: the one vLLM block evicted (the 3 SGLang pages "
                  "evicted before it are not named)")
            check(v.lookup(many) == 0 and v.manager.lookup(many[1:]) == 39
                  and s.storage.batch_exists(keys) == 0, "and those blocks are gone")
            v.manager.complete_store(new, success=False)
        v.close()
    finally:
        d.stop()


def role_victim(engine, socket, outdir):
    """Holds pins (prepare_load) and WRITING blocks (prepare_store), starts a
    transfer and waits to be killed."""
    import time
    inst = engines.VllmInstance(socket)
    tokens, _ = engines.prompt(71, 2)
    hashes = engines.vllm_hashes(tokens, engines.GEO["block_tokens"])
    spec = inst.manager.prepare_load(hashes)
    more = engines.vllm_hashes(engines.prompt(72, 3)[0], engines.GEO["block_tokens"])
    out = inst.manager.prepare_store(more)
    check(-1 not in spec.block_ids and out is not None and len(out.block_hashes_to_store) == 3,
          "victim: 2 blocks pinned for a load, 3 allocated for a store")

    # A store whose copy never ends (its source blocks take an hour to
    # list): the worker is killed in the middle of it.
    class Stuck:
        def __iter__(self):
            time.sleep(3600)
            return iter(())

    class StuckSpec:
        block_ids = Stuck()

        @staticmethod
        def medium():
            return "GPU"
    inst.store_handler.transfer_async(1, (StuckSpec(), out.store_spec))
    inst.load_handler.transfer_async(2, (spec, engines.kvshare.vllm.GPULoadStoreSpec([0, 1])))
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
        check(v.store(engines.vllm_hashes(tokens, engines.GEO["block_tokens"]), [0, 1])[1],
              "a prompt of 2 blocks stored")
        cmd = [sys.executable, os.path.abspath(__file__), "--kvshared", ARGS.kvshared,
               "--lib", ARGS.lib, "--role", "victim", "--engine", "vllm",
               "--socket", d.socket, "--outdir", "-"]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = ""
        while line.strip() != "IN FLIGHT":
            line = p.stdout.readline()
            if not line:
                raise Failure("the victim exited before its transfer: %s" % p.wait())
            print(line.rstrip())
        c = v.manager.keys.client
        st = c.stats()
        check(st["pinned_blocks"] == 2 and st["writing_blocks"] == 3,
              "while its transfers run: 2 blocks pinned, 3 WRITING")
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        check(engines.wait_for(lambda: c.stats()["pinned_blocks"] == 0 and
                               c.stats()["writing_blocks"] == 0),
              "killed mid-transfer: the daemon freed its pins and WRITING blocks")
        check(v.lookup(engines.vllm_hashes(tokens, engines.GEO["block_tokens"])) == 2,
              "the stored prompt is still there")
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


CASES = ["vllm_order", "sglang_order", "vllm_two", "sglang_two", "cross", "daemon_down",
         "evicted", "killed", "geometry", "copier"]


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
        except (Failure, engines.kvshare.KvsError) as e:
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
        except (Failure, engines.kvshare.KvsError, subprocess.TimeoutExpired) as e:
            print("FAILED (%s): %s" % (name, e), flush=True)
            failed.append(name)
    if failed:
        print("FAILED: %s" % ", ".join(failed))
        return FAIL
    print("PASSED: %d cases" % len(ARGS.only or CASES))
    return PASS


if __name__ == "__main__":
    sys.exit(main())
