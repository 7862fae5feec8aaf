# SPDX-License-Identifier: Apache-2.0
"""Engine plug-in figures: the copy path's speed, and prefill and time to
first token with and without kvshare for one prompt shared by two instances.

    bench_engines.py --kvshared PATH --lib PATH [copy] [ttft] [step] [--repeat N]

copy  A kvshared pool of Llama-like blocks (--layers, --kv-heads,
      --head-dim, fp32, 16 tokens per block) and a vLLM instance whose
      paged KV cache has the same blocks (K and V tensors per layer). Times
      the plug-in's worker (submit_load / submit_store until the job is
      done) loading N blocks and storing N new blocks (a store includes
      its Alloc and one Commit RPC per block, made by the worker once the
      copy is done), contiguous and scattered, against a plain PyTorch copy
      of the same bytes in the same run: one dst.copy_(src) per layer and K
      or V of the same size (contiguous tensors). Medians of --repeat runs.
ttft  Instance A (its own process) computes a prompt with the reference
      attention model of tests/client/torch_share.py and stores its KV;
      instance B (another process) gets the prompt plus a continuation and
      runs it twice: computing everything itself, and with kvshare (lookup,
      load, then only the continuation). Prints prefill tokens computed and
      time to first token (the continuation's output) of each.

step  The time each plug-in adds to an engine's step, with kvshared healthy,
      slow (every reply delayed --delay-ms, 10 by default, by a Unix-socket
      proxy between the plug-ins and kvshared, in a process of its own:
      SlowProxy), hung (SIGSTOP)
      and dead (SIGKILL). Per step, in vLLM's newest layout with KV events
      off (vLLM's default): the scheduler's calls for one request (lookup of
      4 stored keys and a fifth that misses, prepare_store of 4 new keys,
      complete_store and on_request_finished of the previous step's
      request) and the worker's (submit_store of those 4 keys,
      get_finished); SGLang's batch_exists (4 stored pages and a miss),
      batch_get_v1 of the 4 and batch_set_v1 of 4 new pages, each timed on
      its own (SGLang calls them from its own threads). The copies run on
      the worker's thread between steps, untimed. timeout_ms 1000 (the
      plug-ins' default). p50, p99 and max of --steps steps.
      --before TREE: the healthy case also with the plug-in code, the
      engines harness and the interface mirrors of TREE (a git worktree of
      an older commit), against the same kvshared and libkvshare, in
      alternate runs (--rounds). Each run is a process of its own.
      --quick: 5 steps, every case in one process, timeout_ms as given
      (the test suite's smoke run gives 200).

CPU tensors, host backend, /usr/bin/python3 with Debian's python3-torch.
Both run one PyTorch thread; say so with the figures.
"""
import argparse
import ctypes
import importlib.util
import inspect
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def _tree():
    """--tree DIR: the step bench's runs import the engines harness (and
    through it the plug-ins) of another checkout; read before the import."""
    for i, a in enumerate(sys.argv):
        if a == "--tree" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--tree="):
            return a.split("=", 1)[1]
    return ROOT


TREE = os.path.abspath(_tree())
# The harness of that tree names vLLM's newest interface "newest", or
# "base" in trees older than the base-era layout.
os.environ["KVS_VLLM_LAYOUT"] = ("newest" if os.path.isdir(os.path.join(
    TREE, "tests", "engines", "upstream", "vllm_newest")) else "base")
sys.path.insert(0, os.path.join(TREE, "tests", "engines"))
engines = None  # the harness (it imports PyTorch): _load_engines()


def _load_engines():
    """Imports the harness of TREE; the step bench's parent process, which
    only starts runs and prints, goes without it (and without PyTorch)."""
    global engines
    import engines as harness
    engines = harness


def interleaved(fns, repeat):
    """Median seconds of each of fns, run in turns (fns[0], fns[1], ..., then
    again) so that a change of the machine's load hits all of them alike."""
    times = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def bench_copy(args, torch):
    engines.configure(args.layers, args.kv_heads, args.head_dim, args.blocks * 2)
    d = engines.daemon(args.kvshared)
    try:
        inst = engines.VllmInstance(d.socket, gpu_blocks=args.blocks * 2)
        mapping = inst.core.refresh()
        copier = mapping.copier
        n = args.blocks
        with engines.kvshare.Client(socket_path=d.socket, map_pool=False) as c:
            pool_ids = c.alloc(n)  # WRITING blocks of this bench: free when it ends
            slot = copier.pairs[0][1].shape[1]
            total = n * slot * len(copier.pairs)
            print("copy: %d blocks of %d layers x K,V x %d KiB = %.1f MiB per transfer "
                  "(pool %s)" % (n, args.layers, slot // 1024, total / 2**20,
                                 "contiguous" if pool_ids == list(range(pool_ids[0],
                                                                        pool_ids[0] + n))
                                 else "ids %s.." % pool_ids[:4]))
            rng = random.Random(1)
            plain_src = [torch.empty(n * slot, dtype=torch.uint8) for _ in copier.pairs]
            plain_dst = [torch.empty(n * slot, dtype=torch.uint8) for _ in copier.pairs]
            for t in plain_src:
                t.random_(0, 255)

            def plain():
                for s, dd in zip(plain_src, plain_dst):
                    dd.copy_(s)

            def plain_memmove():
                for s, dd in zip(plain_src, plain_dst):
                    ctypes.memmove(dd.data_ptr(), s.data_ptr(), n * slot)

            def run(load, src, dst):
                if not load:  # new keys each time: the worker stores them all
                    dst = engines.kvshare.vllm.KvshareLoadStoreSpec(
                        [engines.vllm_key(os.urandom(32)) for _ in range(n)])
                job = inst.submit(load, src, dst)
                inst.core.wait({job})
                if job not in inst.finished():  # asserts success, as vLLM does
                    raise engines.Failure("job %d did not finish" % job)
                if not load and inst.core.counts["store_skipped"]:
                    raise engines.Failure("a store was skipped: %s" % inst.core.last_error)

            methods = args.methods.split(",")
            rows = []
            for name, gpu in (("contiguous", list(range(n))),
                              ("scattered", rng.sample(range(2 * n), n))):
                spool = sorted(pool_ids) if name == "contiguous" else \
                    rng.sample(pool_ids, n)
                pool_spec = engines.kvshare.vllm.KvshareLoadStoreSpec(
                    [b""] * n, spool, mapping.start)
                gpu_spec = engines.gpu_spec(gpu)
                for direction, load, src, dst in (
                        ("store", False, gpu_spec, None),
                        ("load", True, pool_spec, gpu_spec)):
                    def path(m, load=load, src=src, dst=dst):
                        copier.method = m
                        run(load, src, dst)
                    fns = [plain, plain_memmove] + [
                        (lambda m=m: path(m)) for m in methods]
                    for f in fns:
                        f()  # warm
                    t = interleaved(fns, args.repeat)
                    for i, m in enumerate(methods):
                        rows.append((name, direction, m, total / t[2 + i] / 1e9,
                                     total / t[0] / 1e9, total / t[1] / 1e9))
            print("| blocks | direction | copy method | plug-in GB/s | plain copy_ GB/s | ratio "
                  "| plain memmove GB/s | ratio |")
            print("|---|---|---|---|---|---|---|---|")
            for name, direction, m, path_bw, plain_bw, mm_bw in rows:
                print("| %s | %s | %s | %.2f | %.2f | %.0f %% | %.2f | %.0f %% |"
                      % (name, direction, m, path_bw, plain_bw, 100 * path_bw / plain_bw,
                         mm_bw, 100 * path_bw / mm_bw))
        inst.close()
    finally:
        d.stop()


def role(args, torch):
    """One instance of the ttft bench, in its own process."""
    engines.configure(args.layers, args.kv_heads, args.head_dim, args.blocks * 2)
    n = args.prompt_blocks
    bt = engines.GEO["block_tokens"]
    rng = random.Random(7)
    tokens = [rng.randrange(engines.VOCAB) for _ in range(n * bt)]
    cont = [rng.randrange(engines.VOCAB) for _ in range(7)]
    m = engines.model(torch, positions=n * bt + len(cont))
    inst = engines.VllmInstance(args.socket, gpu_blocks=n)
    hashes = engines.vllm_hashes(tokens, bt)
    if args.role == "a":
        _, ks, vs = m.prefill(tokens)
        inst.write_kv(list(range(n)), ks, vs)
        todo = inst.store(hashes, list(range(n)))
        if todo is None or len(todo) != n or inst.core.counts["store_skipped"]:
            raise engines.Failure("A could not store the prompt")
    else:
        m.projected = 0
        t0 = time.perf_counter()
        full, _, _ = m.prefill(tokens + cont)
        t_alone = time.perf_counter() - t0
        alone_tokens = m.projected // args.layers
        m.projected = 0
        t0 = time.perf_counter()
        hits = inst.load(hashes, list(range(n)))
        ks, vs = inst.read_kv(list(range(hits)))
        out = m.extend(cont, ks, vs)
        t_shared = time.perf_counter() - t0
        shared_tokens = m.projected // args.layers
        if hits != n:
            raise engines.Failure("B found %d of %d blocks" % (hits, n))
        err = (out - full[len(tokens):]).abs().max().item()
        print("| B alone | %d | %.1f ms |" % (alone_tokens, 1e3 * t_alone))
        print("| B with kvshare (A's prompt) | %d | %.1f ms |" % (shared_tokens, 1e3 * t_shared))
        print("(prompt %d tokens + %d; continuation outputs agree within %.2g)"
              % (len(tokens), len(cont), err))
    inst.close()


def bench_ttft(args, torch):
    engines.configure(args.layers, args.kv_heads, args.head_dim, args.blocks * 2)
    d = engines.daemon(args.kvshared)
    try:
        print("ttft: %d layers, %d kv heads x %d (x2 query heads), prompt %d tokens"
              % (args.layers, args.kv_heads, args.head_dim,
                 args.prompt_blocks * engines.GEO["block_tokens"]))
        print("| instance | prefill tokens computed | time to first token |")
        print("|---|---|---|")
        for r in ("a", "b"):
            cmd = [sys.executable, os.path.abspath(__file__), "--kvshared", args.kvshared,
                   "--lib", args.lib, "--role", r, "--socket", d.socket] + [
                "--%s=%s" % (k.replace("_", "-"), getattr(args, k))
                for k in ("layers", "kv_heads", "head_dim", "blocks", "prompt_blocks")]
            if subprocess.run(cmd, timeout=600).returncode != 0:
                raise engines.Failure("instance %s failed" % r)
    finally:
        d.stop()


# -- step: what the plug-ins add to a step --------------------------------------

def _kvsd():
    """tests/support/kvsd.py of this checkout (whatever tree the harness
    comes from): every run starts the same kvshared the same way."""
    spec = importlib.util.spec_from_file_location(
        "kvsd_bench", os.path.join(ROOT, "tests", "support", "kvsd.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kwargs(fn, **kw):
    """The keywords among kw that fn (or the config builder it passes them
    to) takes: an older harness has fewer."""
    names = set(inspect.signature(fn).parameters)
    names |= set(inspect.signature(engines.vllm_configs).parameters)
    return {k: v for k, v in kw.items() if k in names}


def step_run(args):
    """One run of the step bench (its own process): each case of --case
    (comma separated) with a kvshared of its own; prints one JSON line per
    case, step name -> seconds of each step."""
    for case in args.case.split(","):
        step_case(args, case)


def step_case(args, case):
    import torch
    kvsd = _kvsd()
    hashes = engines.vllm_hashes
    d = kvsd.Daemon(blocks=256, kvshared=args.kvshared,
                    geometry=dict(engines.GEO, dtype="fp32"))
    proxy = None
    stopped = False
    try:
        path = d.socket
        if case == "slow":
            # In a process of its own: the proxy's threads must not wait for
            # the measured process's GIL (that would be more than the delay).
            path = d.socket + ".slow"
            proxy = subprocess.Popen([sys.executable, os.path.join(HERE, "slow_proxy.py"),
                                      d.socket, path, str(args.delay_ms)])
            if not engines.wait_for(lambda: os.path.exists(path), 30):
                raise engines.Failure("the proxy did not start")
        vkw = _kwargs(engines.VllmInstance.__init__, events=False, timeout_ms=args.timeout_ms)
        v = engines.VllmInstance(path, ns="bench.vllm", gpu_blocks=32, **vkw)
        skw = _kwargs(engines.SglangInstance.__init__, timeout_ms=args.timeout_ms)
        sg = engines.SglangInstance(path, ns="bench.sglang", host_pages=32, **skw)
        m = engines.model(torch)
        tokens, _ = engines.prompt(11, 4)
        _, ks, vs = m.prefill(tokens)
        base = hashes(tokens, engines.GEO["block_tokens"])
        v.write_kv([0, 1, 2, 3], ks, vs)
        sg.write_kv([0, 1, 2, 3], ks, vs)
        if v.store(base, [0, 1, 2, 3]) is None or sg.store(
                engines.sglang_keys(tokens, engines.GEO["block_tokens"]), [0, 1, 2, 3]) != [True] * 4:
            raise engines.Failure("could not store the prompt with kvshared healthy")
        if case == "hung":
            os.kill(d.proc.pid, signal.SIGSTOP)
            stopped = True
        elif case == "dead":
            os.kill(d.proc.pid, signal.SIGKILL)
            d.proc.wait()
        mgr, worker = v.manager, v.worker
        hit = engines.vbase.LookupResult.HIT
        skeys = engines.sglang_keys(tokens, engines.GEO["block_tokens"])
        get_idx, set_idx = sg.indices([4, 5, 6, 7]), sg.indices([8, 9, 10, 11])
        times = {k: [] for k in ("vLLM scheduler step", "vLLM worker step",
                                 "SGLang batch_exists", "SGLang batch_get_v1",
                                 "SGLang batch_set_v1")}
        prev = None
        for i in range(args.steps):
            fresh = [os.urandom(32) for _ in range(5)]
            look = [engines.vllm_key(h) for h in base + fresh[:1]]
            new = [engines.vllm_key(h) for h in fresh[1:]]
            ctx = v.ctx("s%d" % i)
            t0 = time.perf_counter()
            for key in look:
                if mgr.lookup(key, ctx) != hit:
                    break
            out = mgr.prepare_store(new, ctx)
            if prev is not None:
                mgr.complete_store(prev[0], prev[1])
                mgr.on_request_finished(prev[1])
            t1 = time.perf_counter()
            v.job += 1
            job = v.job if out is not None else None
            if out is not None:
                assert worker.submit_store(job, engines.gpu_spec([4, 5, 6, 7]), out.store_spec)
            results = worker.get_finished()
            t2 = time.perf_counter()
            for r in results:
                assert r.success, "vLLM asserts every transfer's success"
            times["vLLM scheduler step"].append(t1 - t0)
            times["vLLM worker step"].append(t2 - t1)
            if job is not None:
                v.core.wait([job])  # the copy, off the step (untimed)
            prev = (list(out.keys_to_store) if out is not None else [], ctx)
            v._contexts.pop("s%d" % i, None)
            pkeys = skeys + ["%064x" % random.getrandbits(256)]
            nkeys = ["%064x" % random.getrandbits(256) for _ in range(4)]
            for name, fn in (("SGLang batch_exists", lambda: sg.storage.batch_exists(pkeys)),
                             ("SGLang batch_get_v1",
                              lambda: sg.storage.batch_get_v1(skeys, get_idx)),
                             ("SGLang batch_set_v1",
                              lambda: sg.storage.batch_set_v1(nkeys, set_idx))):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
            stopped = False
        if case in ("healthy", "slow") and v.core.counts.get("store_skipped"):
            raise engines.Failure("stores were skipped with kvshared up: %s"
                                  % v.core.last_error)
        trips = {}
        for who, client in (("vLLM scheduler", v.manager.core.client), ("vLLM worker", v.core.rpc),
                            ("SGLang", getattr(sg.storage, "client", None))):
            if hasattr(client, "breaker"):
                trips[who] = client.breaker()["trips"]
        print("%s (%s): breaker trips %s" % (case, _commit(TREE), trips or "-"),
              file=sys.stderr, flush=True)
        print(json.dumps({"case": case, "times": times}), flush=True)
        v.close()  # the next case's kvshared is another one
    finally:
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
        if proxy is not None:
            proxy.kill()
            proxy.wait()
        if d.proc.poll() is None:
            d.stop()


def _pct(xs, q):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, int(-(-q * len(xs) // 1)) - 1))]


def _commit(tree):
    """The commit a checkout is at (its short name), or its folder's name."""
    out = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return out.stdout.decode().strip() or os.path.basename(tree)


def _runs(args, case, tree, steps):
    """Runs step_run in a process of its own: {case: {step: [seconds]}}."""
    cmd = [sys.executable, os.path.abspath(__file__), "--kvshared", args.kvshared,
           "--lib", args.lib, "--role", "step", "--case", case, "--tree", tree,
           "--steps", str(steps), "--delay-ms", str(args.delay_ms),
           "--timeout-ms", str(args.timeout_ms)]
    out = subprocess.run(cmd, timeout=600, stdout=subprocess.PIPE)
    if out.returncode != 0:
        raise RuntimeError("step run %s %s failed" % (case, tree))
    got = {}
    for line in out.stdout.decode().splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            got[row["case"]] = row["times"]
    return got


def bench_step(args):
    """Runs step_run per case (the healthy ones per tree, in turns; --quick:
    every case in one process), prints the table."""
    runs = [("healthy", TREE)]
    if args.before:
        runs.insert(0, ("healthy", os.path.abspath(args.before)))
    rounds = 1 if args.quick else args.rounds
    steps = 5 if args.quick else args.steps
    failing = ("slow", "hung", "dead")
    if args.quick:
        runs = [(",".join(("healthy",) + failing), TREE)] + runs[:-1]
    got = {}
    order = []

    def label(case, tree):
        if case == "slow":
            return "slow (+%g ms per reply)" % args.delay_ms
        if case == "healthy":
            return ("healthy (%s)" if tree == TREE else "healthy, before (%s)") % _commit(tree)
        return case
    for _ in range(rounds):
        for cases, tree in runs:
            for case, times in _runs(args, cases, tree, steps).items():
                key = label(case, tree)
                if key not in got:
                    order.append(key)
                    got[key] = {}
                for name, xs in times.items():
                    got[key].setdefault(name, []).extend(xs)
    if not args.quick:
        for case in failing:
            for c, times in _runs(args, case, TREE, steps).items():
                order.append(label(c, TREE))
                got[label(c, TREE)] = times
    for case in ("hung", "dead"):
        for name, xs in got[case].items():
            # The client's breaker: past the first timeout, a step with
            # kvshared hung or dead costs no timeout (ENGINES.md).
            if statistics.median(xs) > 0.05:
                raise RuntimeError("kvshared %s: %s takes %.1f ms at the median"
                                      % (case, name, 1e3 * statistics.median(xs)))
    names = list(next(iter(got.values())))
    print("step: %d steps x %d rounds; p50 / p99 / max in ms" % (steps, rounds))
    print("| step | " + " | ".join(order) + " |")
    print("|---|" + "---|" * len(order))
    for name in names:
        cells = []
        for key in order:
            xs = got[key][name]
            cells.append("%.2f / %.2f / %.1f" % (1e3 * statistics.median(xs),
                                                 1e3 * _pct(xs, 0.99), 1e3 * max(xs)))
        print("| %s | %s |" % (name, " | ".join(cells)))

def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="*", default=["copy", "ttft"])
    p.add_argument("--kvshared", default=os.environ.get("KVSHARED"))
    p.add_argument("--lib", default=os.environ.get("KVSHARE_LIB"))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--blocks", type=int, default=64, help="blocks per copy transfer")
    p.add_argument("--prompt-blocks", type=int, default=64, help="ttft prompt, in blocks")
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--methods", default="slices,memmove",
                   help="copy methods of kvshare.tensors.BlockCopier to time, comma separated "
                        "(slices: one copy_ per run, as before memmove)")
    p.add_argument("--role", choices=("a", "b", "step"))
    p.add_argument("--socket")
    p.add_argument("--steps", type=int, default=200, help="step: steps per run")
    p.add_argument("--rounds", type=int, default=3,
                   help="step: runs of each healthy case, taken in turns")
    p.add_argument("--delay-ms", type=float, default=10.0, help="step: slow case's delay")
    p.add_argument("--before", help="step: a checkout of older plug-in code (a git worktree)")
    p.add_argument("--tree", help=argparse.SUPPRESS)
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--timeout-ms", type=int, default=1000,
                   help="step: the plug-ins' timeout_ms (their default: 1000)")
    p.add_argument("--quick", action="store_true", help="step: 5 steps, one round, one process")
    args = p.parse_args()
    if args.lib:
        os.environ["KVSHARE_LIB"] = args.lib
    if not args.role and args.what == ["step"]:
        if importlib.util.find_spec("torch") is None:
            print("skipped: PyTorch is not importable by %s" % sys.executable)
            return 77
        bench_step(args)
        return 0
    try:
        import torch
    except ImportError as e:
        print("skipped: PyTorch is not importable by %s: %s" % (sys.executable, e))
        return 77
    _load_engines()
    torch.set_num_threads(1)
    if args.role == "step":
        step_run(args)
        return 0
    if args.role:
        role(args, torch)
        return 0
    print("torch %s, %d PyTorch thread, %s" % (torch.__version__, torch.get_num_threads(),
                                               os.uname().machine))
    if "copy" in args.what:
        bench_copy(args, torch)
    if "ttft" in args.what:
        bench_ttft(args, torch)
    if "step" in args.what:
        bench_step(args)
    return 0


if __name__ == "__main__":
    tempfile.tempdir = os.environ.get("TMPDIR") or None
    sys.exit(main())
