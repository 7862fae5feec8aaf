# SPDX-License-Identifier: Apache-2.0
"""Namespaces declared in a config file: quotas and reservations (the
long-context tier next to short chats), unknown namespaces, per-session
limits, --check-config, flags over the file, SIGHUP reload, SIGTERM drain."""
import json
import os
import signal
import socket
import subprocess
import time
import unittest

from ops_daemon import BT, Daemon, kvshare, kvsd, metric, parse_metrics

POOL = 1024
SYSTEM_BLOCKS = 4    # the system prompt every chat starts with
CHATS = 40
CHAT_FIRST = 4       # blocks of a chat's first prompt after the system prompt
CHAT_GROWTH = 1      # blocks each turn adds (the last answer and the new message)
LONG = 3
LONG_STEP = 32       # blocks a long session adds per turn
LONG_MAX = 400       # then it starts a new conversation
ROUNDS = 40          # every chat speaks every fourth round: 10 turns each
WARMUP_ROUNDS = 4    # every chat has spoken once by then
RESERVE = 600        # the chats' whole working set (4 + 40 x 13 = 524 blocks) fits
LONG_QUOTA = 400
LENT_ROUNDS = 16     # long sessions alone before the chats start


def blocks_of(base, n):
    return [base + k for k in range(n * BT)]


SYSTEM = blocks_of(7_000_000, SYSTEM_BLOCKS)
CHAT_WORKING_SET = SYSTEM_BLOCKS + CHATS * (CHAT_FIRST + CHAT_GROWTH * (ROUNDS // 4 - 1))


def drain(client, ids):
    """Everything this client holds on these blocks: every pin, or the block
    itself while it is WRITING."""
    for b in set(ids):
        try:
            while client.release([b]):
                pass
        except kvshare.KvsError:
            pass


def turn(client, ns, prompt):
    """A worker's request: look the prompt up (pinning the hit), compute and
    write the blocks it misses, commit the whole prompt (naming the pinned
    hit), release. Returns the hit in tokens; a pool or quota refusal only
    means the new blocks are not cached."""
    hit = client.lookup(prompt, ns=ns, pin=True)
    missing = len(prompt) // BT - len(hit)
    new = []
    try:
        if missing:
            new = client.alloc(missing, ns=ns)
            canonical = client.commit(prompt, hit + new, ns=ns)
            client.release(canonical)
            client.release([b for b in new if b not in canonical])
        client.release(hit)
    except kvshare.KvsError:
        drain(client, hit + new)
    return len(hit) * BT


def chat_prompt(i, k):
    """Chat i's k-th turn: the system prompt, then its conversation so far
    plus the new message (each turn extends the one before)."""
    return SYSTEM + blocks_of(8_000_000 + 10_000 * i, CHAT_FIRST + CHAT_GROWTH * k)


def replay(daemon, long_only_rounds=0):
    """Three long sessions and forty chats sharing a system prompt, the same
    sequence every time: each round every long session adds a turn, and a
    quarter of the chats speak between them. With long_only_rounds, the
    chats start only after that many rounds of the long sessions alone.
    Returns the chats' hit rate after warm-up, per round too, the stats at
    the end and (with long_only_rounds) when the chats start."""
    chat_hit = chat_total = 0
    per_round = []
    long_len = [0] * LONG
    long_conv = [0] * LONG
    turns = [0] * CHATS
    with kvshare.Client(socket_path=daemon.socket, map_pool=False, timeout_ms=10000) as lc, \
            kvshare.Client(socket_path=daemon.socket, map_pool=False, timeout_ms=10000) as cc:
        lent = None
        for r in range(long_only_rounds + ROUNDS):
            cr = r - long_only_rounds
            if long_only_rounds and cr == 0:
                lent = cc.stats()
            speakers = [i for i in range(CHATS) if i % 4 == cr % 4] if cr >= 0 else []
            rh = rt = 0
            for j in range(LONG):
                if long_len[j] >= LONG_MAX:
                    long_conv[j] += 1
                    long_len[j] = 0
                long_len[j] += LONG_STEP
                turn(lc, "long", blocks_of(10_000_000 * (j + 1) + 100_000 * long_conv[j],
                                           long_len[j]))
                for i in speakers[j * len(speakers) // LONG:(j + 1) * len(speakers) // LONG]:
                    prompt = chat_prompt(i, turns[i])
                    turns[i] += 1
                    rh += turn(cc, "chat", prompt)
                    rt += len(prompt)
            if cr >= WARMUP_ROUNDS:
                chat_hit += rh
                chat_total += rt
                per_round.append(rh / rt)
        stats = cc.stats()
    return chat_hit / chat_total, per_round, stats, lent


def best_rate():
    """Every turn hits all of the turn before it: what no eviction at all gives."""
    hit = total = 0
    for i in range(CHATS):
        for k in range(ROUNDS // 4):
            if k * 4 + i % 4 >= WARMUP_ROUNDS:
                n = len(chat_prompt(i, k))
                hit += n - CHAT_GROWTH * BT if k else 0
                total += n
    return hit / total


def config(chat_reserve, long_quota=0, long_reserve=0):
    return ("# two tiers on one pool\n"
            "[namespace chat]\n"
            "reserve = %d\n"
            "[namespace long]\n"
            "quota = %d\n"
            "reserve = %d\n" % (chat_reserve, long_quota, long_reserve))


class ReservationTest(unittest.TestCase):
    """The rule: a namespace below its reservation takes blocks from the
    namespaces above theirs before it evicts its own; others' need never
    takes it below. So a reservation alone, without a quota on the long
    tier, keeps the chats' working set cached."""

    def run_with(self, *args, long_only_rounds=0, metrics=False):
        d = Daemon(blocks=POOL, config=config(*args), metrics=metrics)
        try:
            rate, per_round, stats, lent = replay(d, long_only_rounds)
            ns = {n["name"]: n for n in stats["namespaces"]}
            if lent:
                self.lent = {n["name"]: n for n in lent["namespaces"]}
            if metrics:
                m = parse_metrics(d.scrape())
                for name, n in ns.items():
                    for cause in ("own", "others", "quota"):
                        self.assertEqual(metric(m, "kvshare_namespace_evictions_total",
                                                namespace=name, cause=cause),
                                         n["evicted_" + cause])
        finally:
            self.assertEqual(d.stop(), 0)
        for n in ns.values():
            self.assertEqual(n["evicted_blocks"],
                             n["evicted_own"] + n["evicted_others"] + n["evicted_quota"])
        return rate, per_round, ns

    def report(self, label, rate, per_round, ns):
        print("\n%-34s chats %.1f%% (rounds %.0f-%.0f%%), chat holds %d, long holds %d, "
              "long evicted for the chats %d" %
              (label, 100 * rate, 100 * min(per_round), 100 * max(per_round),
               ns["chat"]["cached_blocks"], ns["long"]["cached_blocks"],
               ns["long"]["evicted_others"]))

    def test_reservation_alone_protects_the_chats(self):
        alone = self.run_with(RESERVE, metrics=True)
        with_quota = self.run_with(RESERVE, LONG_QUOTA)
        none = self.run_with(0)
        self.report("reserve %d, no quota" % RESERVE, *alone)
        self.report("reserve %d, long quota %d" % (RESERVE, LONG_QUOTA), *with_quota)
        self.report("no reservation, no quota", *none)
        print("best possible %.1f%%" % (100 * best_rate()))
        rate, per_round, ns = alone
        # Within 3 points of reservation plus quota, and far above nothing.
        self.assertLess(abs(rate - with_quota[0]), 0.03)
        self.assertGreater(rate, best_rate() - 0.03)
        self.assertGreater(rate - none[0], 0.3)
        # The chats never lost a block to the long tier's need, and hold their
        # whole working set; the long tier gave back what it held over its 0.
        self.assertEqual(ns["chat"]["evicted_others"], 0)
        self.assertEqual(ns["chat"]["cached_blocks"], CHAT_WORKING_SET)
        self.assertGreater(ns["long"]["evicted_others"], 0)

    def test_reservations_adding_up_to_the_pool(self):
        long_reserve = POOL - RESERVE
        rate, per_round, ns = self.run_with(RESERVE, 0, long_reserve)
        self.report("reserve %d + long reserve %d" % (RESERVE, long_reserve), rate, per_round, ns)
        self.assertGreater(rate, best_rate() - 0.03)
        self.assertEqual(ns["chat"]["evicted_others"], 0)
        self.assertEqual(ns["chat"]["cached_blocks"], CHAT_WORKING_SET)
        # The long tier keeps its own reservation too.
        self.assertGreaterEqual(ns["long"]["cached_blocks"], long_reserve)

    def test_unused_reservation_is_lent_and_taken_back(self):
        # The long sessions run alone first: they fill the pool, chat's
        # reservation included.
        rate, per_round, ns = self.run_with(RESERVE, long_only_rounds=LENT_ROUNDS)
        self.report("reserve %d, chats start late" % RESERVE, rate, per_round, ns)
        lent = self.lent["long"]["cached_blocks"]
        print("before the chats start, long holds %d (pool %d, chat's reservation %d)" %
              (lent, POOL, RESERVE))
        self.assertGreater(lent, POOL - RESERVE + LONG_STEP)
        self.assertGreater(rate, best_rate() - 0.03)
        self.assertEqual(ns["chat"]["evicted_others"], 0)
        self.assertEqual(ns["chat"]["cached_blocks"], CHAT_WORKING_SET)
        self.assertGreater(ns["long"]["evicted_others"], 0)


class NamespaceTest(unittest.TestCase):
    def test_unknown_namespace_is_an_error_with_a_config(self):
        d = Daemon(blocks=32, config="[namespace chat]\nquota = 16\n", metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                self.assertEqual(c.lookup([1] * BT, ns="chat", pin=False), [])
                with self.assertRaises(kvshare.KvsError) as e:
                    c.lookup([1] * BT, ns="other", pin=False)
                self.assertEqual(e.exception.status, kvshare.STATUS["ENONS"])
                self.assertIn("[namespace other]", c.last_error)
                with self.assertRaises(kvshare.KvsError):
                    c.lookup([1] * BT, pin=False)  # "default" is not declared either
                ns = {n["name"]: n for n in c.stats()["namespaces"]}
                self.assertEqual(ns["chat"]["quota"], 16)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_dynamic_namespaces_when_allowed(self):
        d = Daemon(blocks=32, config="dynamic_namespaces = yes\n[namespace chat]\n",
                   metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                self.assertEqual(c.lookup([1] * BT, ns="anything", pin=False), [])
        finally:
            self.assertEqual(d.stop(), 0)

    def test_session_limits(self):
        d = Daemon(blocks=64, metrics=False,
                   extra=["--session-max-writing", "8", "--session-max-pinned", "6"])
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                ids = c.alloc(8)
                with self.assertRaises(kvshare.KvsError) as e:
                    c.alloc(1)
                self.assertEqual(e.exception.status, kvshare.STATUS["ELIMIT"])
                self.assertIn("session_max_writing = 8", c.last_error)
                tokens = list(range(8 * BT))
                # Committing 8 blocks pins 8: over the pin limit of 6.
                with self.assertRaises(kvshare.KvsError) as e:
                    c.commit(tokens, ids)
                self.assertEqual(e.exception.status, kvshare.STATUS["ELIMIT"])
                self.assertIn("session_max_pinned = 6", c.last_error)
                can = c.commit(tokens[:6 * BT], ids[:6])
                self.assertEqual(len(can), 6)
                with self.assertRaises(kvshare.KvsError):
                    c.lookup(tokens, pin=True)  # 6 more pins
                self.assertIn("session_max_pinned", c.last_error)
                c.release(can)
                self.assertEqual(len(c.lookup(tokens, pin=True)), 6)
                # Another session has its own allowance.
                with kvshare.Client(socket_path=d.socket, map_pool=False) as other:
                    self.assertEqual(len(other.alloc(8)), 8)
        finally:
            self.assertEqual(d.stop(), 0)


class ConfigTest(unittest.TestCase):
    def check(self, text):
        path = os.path.join(self.dir, "k.conf")
        with open(path, "w") as f:
            f.write(text)
        return subprocess.run([os.environ["KVSHARED"], "--check-config", path],
                              capture_output=True, text=True, timeout=30)

    def setUp(self):
        import tempfile
        self.dir = tempfile.mkdtemp(prefix="kvs-conf-")

    def test_check_config_reports_lines(self):
        r = self.check("pool_blocks = 64\n"
                       "max_sessions = lots\n"
                       "\n"
                       "colour = blue\n"
                       "[namespace chat]\n"
                       "quota = 10\n"
                       "reserve = 20\n"
                       "pool_blocks = 3\n")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("k.conf:2: max_sessions = 'lots'", r.stderr)
        self.assertIn("k.conf:4: unknown key 'colour'", r.stderr)
        self.assertIn("k.conf:8: 'pool_blocks' is a global key", r.stderr)
        self.assertIn("k.conf:5: namespace 'chat': reserve 20 is above its quota 10", r.stderr)

    def test_check_config_ok(self):
        example = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                               "packaging", "kvshared.conf")
        with open(example) as f:
            r = self.check(f.read())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("OK", r.stdout)

    def test_flags_override_the_file(self):
        d = Daemon(blocks=48, config="pool_blocks = 16\nmax_sessions = 4\n"
                                     "dynamic_namespaces = yes\n", metrics=False,
                   extra=["--log-level", "info"])
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                self.assertEqual(c.stats()["total_blocks"], 48)
            self.assertIn("max_sessions 4", d.log())
        finally:
            self.assertEqual(d.stop(), 0)

    def test_sighup_reloads_limits_and_keeps_the_cache(self):
        d = Daemon(blocks=64, config="[namespace chat]\nquota = 32\nreserve = 8\n",
                   extra=["--log-level", "info"], metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                tokens = list(range(10 * BT))
                ids = c.alloc(10, ns="chat")
                c.release(c.commit(tokens, ids, ns="chat"))
                with open(d.config, "w") as f:
                    f.write("[namespace chat]\nquota = 48\nreserve = 16\n[namespace new]\n")
                d.proc.send_signal(signal.SIGHUP)
                for _ in range(100):
                    ns = {n["name"]: n for n in c.stats()["namespaces"]}
                    if ns["chat"]["quota"] == 48:
                        break
                    time.sleep(0.05)
                self.assertEqual(ns["chat"]["quota"], 48)
                self.assertEqual(ns["chat"]["reserve"], 16)
                self.assertIn("new", ns)
                self.assertEqual(ns["chat"]["cached_blocks"], 10)
                self.assertEqual(len(c.lookup(tokens, ns="chat", pin=False)), 10)
                # A bad file changes nothing.
                with open(d.config, "w") as f:
                    f.write("[namespace chat]\nquota = many\n")
                d.proc.send_signal(signal.SIGHUP)
                for _ in range(100):
                    if "not reloaded" in d.log():
                        break
                    time.sleep(0.05)
                self.assertIn("kvshared.conf:2: quota = 'many'", d.log())
                ns = {n["name"]: n for n in c.stats()["namespaces"]}
                self.assertEqual(ns["chat"]["quota"], 48)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_sighup_with_the_config_path_at_a_device_or_fifo(self):
        # The path now names /dev/zero, then a FIFO without a writer: each
        # reload is refused at once and counted; the daemon keeps serving
        # (it hung for good on /dev/zero before).
        d = Daemon(blocks=32, config="[namespace chat]\nquota = 8\n", metrics=False,
                   extra=["--log-level", "info"])
        fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(fifo)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                for target, n in (("/dev/zero", 1), (fifo, 2)):
                    os.unlink(d.config)
                    os.symlink(target, d.config)
                    d.proc.send_signal(signal.SIGHUP)
                    t0 = time.monotonic()
                    while c.stats()["config_reload_errors"] < n and time.monotonic() - t0 < 5:
                        time.sleep(0.02)
                    self.assertEqual(c.stats()["config_reload_errors"], n)
                    self.assertLess(time.monotonic() - t0, 2.0)
                self.assertIn("not a regular file", d.log())
                ns = {n["name"]: n for n in c.stats()["namespaces"]}
                self.assertEqual(ns["chat"]["quota"], 8)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_sighup_reclaims_unused_namespaces_for_new_sections(self):
        # A table full of dynamic namespaces that hold nothing makes room for
        # the sections a reload adds (before, the reload was refused).
        d = Daemon(blocks=32, config="dynamic_namespaces = yes\nmax_namespaces = 4\n"
                   "[namespace chat]\n", extra=["--log-level", "info"], metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                for i in range(3):
                    c.lookup([1] * BT, ns="junk-%d" % i, pin=False)
                self.assertEqual(len(c.stats()["namespaces"]), 4)
                with open(d.config, "w") as f:
                    f.write("dynamic_namespaces = yes\nmax_namespaces = 4\n"
                            "[namespace chat]\n[namespace new]\nquota = 8\n")
                d.proc.send_signal(signal.SIGHUP)
                for _ in range(100):
                    if "SIGHUP: reloaded" in d.log() or "not reloaded" in d.log():
                        break
                    time.sleep(0.05)
                self.assertIn("SIGHUP: reloaded", d.log())
                ns = {n["name"]: n for n in c.stats()["namespaces"]}
                self.assertEqual(sorted(ns), ["chat", "new"])
                self.assertEqual(ns["new"]["quota"], 8)
                self.assertEqual(c.stats()["namespaces_reclaimed"], 3)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_sigterm_drains(self):
        d = Daemon(blocks=32, metrics=False)
        c = kvshare.Client(socket_path=d.socket, map_pool=False)
        ids = c.alloc(4)
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.connect(d.socket)
        start = time.monotonic()
        sock = d.socket
        self.assertEqual(d.stop(), 0)
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertFalse(os.path.exists(sock))
        # Each session was told why before its connection closed: one
        # Response frame carrying the reason, then end of stream.
        raw.settimeout(5)
        data = b""
        while True:
            chunk = raw.recv(4096)
            if not chunk:
                break
            data += chunk
        raw.close()
        self.assertGreater(len(data), kvsd.FRAME_HEADER_BYTES)
        self.assertEqual(kvsd.frame_len(data), len(data) - kvsd.FRAME_HEADER_BYTES)
        self.assertIn(b"kvshared is stopping", data)
        # The client is told, then answers lookups as misses.
        self.assertEqual(c.lookup([1] * BT, pin=False), [])
        self.assertFalse(c.connected)
        del ids
        c.close()


class ClearTest(unittest.TestCase):
    """Clear drops a namespace's unpinned cached blocks, keeps pinned ones and
    their prefixes and WRITING blocks, never touches another namespace, and
    is refused on a namespace the peer may not use."""

    NOBODY = 4242424  # a uid no test process has

    def test_clear(self):
        d = Daemon(blocks=64, config="[namespace open]\n[namespace other]\n"
                                     "[namespace secret]\nallow_uids = %d\n" % self.NOBODY)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                kept = blocks_of(100, 3)        # its last block stays pinned
                gone = blocks_of(200, 2)
                other = blocks_of(300, 2)
                pinned = c.commit(kept, c.alloc(3, ns="open"), ns="open")
                c.release(pinned[:2])
                c.release(c.commit(gone, c.alloc(2, ns="open"), ns="open"))
                c.release(c.commit(other, c.alloc(2, ns="other"), ns="other"))
                writing = c.alloc(1, ns="open")
                self.assertEqual(c.clear("open"), (2, 3))  # "gone"; "kept" is a pinned prefix
                self.assertEqual(len(c.lookup(kept, ns="open", pin=False)), 3)
                self.assertEqual(c.lookup(gone, ns="open", pin=False), [])
                self.assertEqual(len(c.lookup(other, ns="other", pin=False)), 2)
                st = c.stats()
                self.assertEqual(st["writing_blocks"], 1)
                self.assertEqual(st["cached_blocks"], 5)
                self.assertEqual(st["free_blocks"] + st["writing_blocks"] + st["cached_blocks"],
                                 64)
                self.assertEqual(st["clears"], 1)
                self.assertEqual(st["cleared_blocks"], 2)
                # Pins gone: a second clear takes the rest; a third finds nothing.
                c.release(pinned[2:] + writing)
                self.assertEqual(c.clear("open"), (3, 0))
                self.assertEqual(c.clear("open"), (0, 0))
                for ns, status, says in (("secret", "EDENIED", "allow_uids"),
                                         ("nosuch", "ENONS", "nosuch")):
                    with self.assertRaises(kvshare.KvsError) as e:
                        c.clear(ns)
                    self.assertEqual(e.exception.status, kvshare.STATUS[status],
                                     str(e.exception))
                    self.assertIn(says, str(e.exception))
                m = parse_metrics(d.scrape())
                self.assertEqual(metric(m, "kvshare_clears_total"), 3)
                self.assertEqual(metric(m, "kvshare_cleared_blocks_total"), 5)
                self.assertEqual(metric(m, "kvshare_evictions_total"), 5)
                self.assertGreaterEqual(metric(m, "kvshare_namespace_denied_total"), 1)
        finally:
            self.assertEqual(d.stop(), 0)


class EvictTest(unittest.TestCase):
    """Evict drops one prompt's blocks that nothing else needs, keeps a
    prefix that another prompt continues and pinned blocks, counts them as
    evictions and per-RPC requests, and is refused on a namespace the peer
    may not use."""

    NOBODY = 4242424  # a uid no test process has

    def test_evict(self):
        d = Daemon(blocks=64, config="[namespace open]\n"
                                     "[namespace secret]\nallow_uids = %d\n" % self.NOBODY)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                system = blocks_of(100, 2)
                chat_a = system + blocks_of(200, 2)
                chat_b = system + blocks_of(300, 1)
                c.release(c.commit(chat_a, c.alloc(4, ns="open"), ns="open"))
                ids = c.alloc(3, ns="open")
                canon = c.commit(chat_b, ids, ns="open")
                c.release(canon + ids[:2])  # ids[:2] duplicate the system prompt
                # chat_a's own blocks go; the system prompt chat_b continues stays.
                self.assertEqual(c.evict(chat_a, ns="open"), (2, 0, 2))
                self.assertEqual(len(c.lookup(chat_a, ns="open", pin=False)), 2)
                self.assertEqual(len(c.lookup(chat_b, ns="open", pin=False)), 3)
                # Pinned, chat_b stays; released, it goes with the system prompt.
                held = c.lookup(chat_b, ns="open")
                self.assertEqual(c.evict(chat_b, ns="open"), (0, 0, 3))
                c.release(held)
                self.assertEqual(c.evict(chat_b, ns="open"), (3, 0, 0))
                st = c.stats()
                self.assertEqual(st["cached_blocks"], 0)
                self.assertEqual(st["evictions"], 5)
                for ns, status, says in (("secret", "EDENIED", "allow_uids"),
                                         ("nosuch", "ENONS", "nosuch")):
                    with self.assertRaises(kvshare.KvsError) as e:
                        c.evict(chat_a, ns=ns)
                    self.assertEqual(e.exception.status, kvshare.STATUS[status],
                                     str(e.exception))
                    self.assertIn(says, str(e.exception))
                m = parse_metrics(d.scrape())
                self.assertEqual(metric(m, "kvshare_evictions_total"), 5)
                self.assertEqual(metric(m, "kvshare_rpc_requests_total", rpc="Evict"), 5)
                self.assertEqual(metric(m, "kvshare_rpc_errors_total", rpc="Evict"), 2)
        finally:
            self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
