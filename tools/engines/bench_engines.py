# SPDX-License-Identifier: Apache-2.0
"""Engine plug-in figures: the copy path's speed, and prefill and time to
first token with and without kvshare for one prompt shared by two instances.

    bench_engines.py --kvshared PATH --lib PATH [copy] [ttft] [--repeat N]

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

CPU tensors, host backend, /usr/bin/python3 with Debian's python3-torch.
Both run one PyTorch thread; say so with the figures.
"""
import argparse
import ctypes
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "engines"))
import engines  # noqa: E402


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
    p.add_argument("--role", choices=("a", "b"))
    p.add_argument("--socket")
    args = p.parse_args()
    if args.lib:
        os.environ["KVSHARE_LIB"] = args.lib
    import torch
    torch.set_num_threads(1)
    if args.role:
        role(args, torch)
        return 0
    print("torch %s, %d PyTorch thread, %s" % (torch.__version__, torch.get_num_threads(),
                                               os.uname().machine))
    if "copy" in args.what:
        bench_copy(args, torch)
    if "ttft" in args.what:
        bench_ttft(args, torch)
    return 0


if __name__ == "__main__":
    tempfile.tempdir = os.environ.get("TMPDIR") or None
    sys.exit(main())
