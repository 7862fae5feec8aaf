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

from ops_daemon import BT, Daemon, kvshare

POOL = 768
SYSTEM_BLOCKS = 4    # the system prompt every chat starts with
HISTORY_BLOCKS = 6   # each chat's conversation so far
TAIL_BLOCKS = 1      # each chat turn's new message
CHATS = 40
LONG = 3
LONG_STEP = 32       # blocks a long session adds per turn
LONG_MAX = 320      # then it starts a new conversation
ROUNDS = 24
WARMUP_ROUNDS = 4    # every chat has spoken once by then
RESERVE = 256        # the chats' whole working set (4 + 40 x 6 = 244 blocks) fits


def blocks_of(base, n):
    return [base + k for k in range(n * BT)]


SYSTEM = blocks_of(7_000_000, SYSTEM_BLOCKS)


def write_and_commit(client, ns, prompt):
    """A worker computes the prompt's blocks, writes them, commits them and
    releases them (duplicates of blocks already cached are freed). Returns
    False when the pool had no room (the request then simply is not cached)."""
    n = len(prompt) // BT
    try:
        ids = client.alloc(n, ns=ns)
    except kvshare.KvsError:
        return False
    try:
        canonical = client.commit(prompt, ids, ns=ns)
    except kvshare.KvsError:
        canonical = []
    client.release(canonical)
    client.release([b for b, c in zip(ids, canonical + [None] * n) if b != c])
    return True


def long_turn(client, prompt):
    client.lookup(prompt, ns="long", pin=False)
    write_and_commit(client, "long", prompt)


def chat_turn(client, i, r):
    """Returns (hit tokens, prompt tokens). The cacheable part is the system
    prompt and the chat's history; the new message is not reused later, so
    it is not committed, and a turn that hits all of the rest writes nothing."""
    cacheable = SYSTEM + blocks_of(8_000_000 + 1000 * i, HISTORY_BLOCKS)
    prompt = cacheable + blocks_of(9_000_000 + 10_000 * i + 100 * r, TAIL_BLOCKS)
    hit = len(client.lookup(prompt, ns="chat", pin=False)) * BT
    if hit < len(cacheable):
        write_and_commit(client, "chat", cacheable)
    return hit, len(prompt)


def replay(daemon):
    """Three long sessions and forty short chats sharing a system prompt,
    the same sequence every time: each round every long session adds a
    turn, and a quarter of the chats speak between them. Returns the chats'
    hit rate after warm-up, and the daemon's stats."""
    chat_hit = chat_total = 0
    long_len = [0] * LONG
    long_conv = [0] * LONG
    with kvshare.Client(socket_path=daemon.socket, map_pool=False, timeout_ms=10000) as lc, \
            kvshare.Client(socket_path=daemon.socket, map_pool=False, timeout_ms=10000) as cc:
        for r in range(ROUNDS):
            speakers = [i for i in range(CHATS) if i % 4 == r % 4]
            for j in range(LONG):
                if long_len[j] >= LONG_MAX:
                    long_conv[j] += 1
                    long_len[j] = 0
                long_len[j] += LONG_STEP
                long_turn(lc, blocks_of(10_000_000 * (j + 1) + 100_000 * long_conv[j],
                                        long_len[j]))
                for i in speakers[j * len(speakers) // LONG:(j + 1) * len(speakers) // LONG]:
                    hit, total = chat_turn(cc, i, r)
                    if r >= WARMUP_ROUNDS:
                        chat_hit += hit
                        chat_total += total
        stats = cc.stats()
    return chat_hit / chat_total, stats


def config(reserve):
    return ("# two tiers on one pool\n"
            "[namespace chat]\n"
            "reserve = %d\n"
            "[namespace long]\n"
            "quota = 0\n" % reserve)


class ReservationTest(unittest.TestCase):
    def run_with(self, reserve):
        d = Daemon(blocks=POOL, config=config(reserve), metrics=False)
        try:
            rate, _ = replay(d)
        finally:
            self.assertEqual(d.stop(), 0)
        return rate

    def test_chats_hold_with_a_reservation_and_collapse_without(self):
        with_reserve = self.run_with(RESERVE)
        without = self.run_with(0)
        best = (SYSTEM_BLOCKS + HISTORY_BLOCKS) / (SYSTEM_BLOCKS + HISTORY_BLOCKS + TAIL_BLOCKS)
        print("\nshort chats' hit rate: %.1f%% with a %d-block reservation, %.1f%% without "
              "(best possible %.1f%%)" % (100 * with_reserve, RESERVE, 100 * without, 100 * best))
        self.assertGreater(with_reserve, 0.85)
        self.assertLess(without, 0.5)
        self.assertGreater(with_reserve - without, 0.4)


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
        self.assertGreater(len(data), 4)
        self.assertEqual(int.from_bytes(data[:4], "little"), len(data) - 4)
        self.assertIn(b"kvshared is stopping", data)
        # The client is told, then answers lookups as misses.
        self.assertEqual(c.lookup([1] * BT, pin=False), [])
        self.assertFalse(c.connected)
        del ids
        c.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
