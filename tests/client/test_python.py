# SPDX-License-Identifier: Apache-2.0
"""The Python binding against a real kvshared (host backend, temporary socket).

Run by ctest with KVSHARED (the daemon binary) and KVSHARE_LIB (libkvshare.so)
in the environment.
"""
import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "client", "python"))
import kvshare  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "support"))
import kvsd  # noqa: E402
from kvsd import BT  # noqa: E402

POOL = 32


def Daemon():
    # Hints above the default cap (default_max_priority) are tested here.
    return kvsd.Daemon(blocks=POOL, extra=["--default-max-priority", "100"])


class BindingTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()

    def tearDown(self):
        self.assertEqual(self.daemon.stop(), 0)

    def client(self, **kw):
        return kvshare.Client(socket_path=self.daemon.socket, timeout_ms=20000, **kw)

    def test_ranks_of_several_devices(self):
        # Two simulated devices: each rank maps its own pool, the group
        # caches a block once both ranks committed it.
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon = kvsd.Daemon(blocks=POOL, extra=("--devices", "0-1"))
        tokens = list(range(500, 500 + BT))
        with self.client(rank=0) as r0, self.client(rank=1) as r1:
            self.assertEqual(r0.group, (0, 2))
            self.assertEqual(r1.group, (1, 2))
            ids = r0.alloc(1)
            r0.block_write(0, 0, ids[0], b"\x01" * 8)
            r1.block_write(0, 0, ids[0], b"\x02" * 8)
            self.assertEqual(r0.commit(tokens, ids), [])
            self.assertEqual(r1.lookup(tokens), [])
            self.assertEqual(r1.commit(tokens, ids), ids)
            self.assertEqual(r0.lookup(tokens), ids)
            self.assertEqual(r0.block_read(0, 0, ids[0], 8), b"\x01" * 8)
            self.assertEqual(r1.block_read(0, 0, ids[0], 8), b"\x02" * 8)
        with self.assertRaises(kvshare.KvsError):
            self.client()

    def test_status_table_matches_library(self):
        for name, code in kvshare.STATUS.items():
            self.assertNotEqual(kvshare.strerror(code), "unknown kvshare status", name)
        self.assertEqual(kvshare.strerror(-1000), "unknown kvshare status")

    def test_share_bytes_between_clients(self):
        tokens = list(range(1000, 1000 + 3 * BT + 1))
        with self.client(worker_name="A") as a, self.client(worker_name="B") as b:
            geo = a.geometry
            self.assertEqual(geo["block_tokens"], BT)
            self.assertEqual(geo["num_blocks"], POOL)
            self.assertEqual(geo["backend"], "host")
            self.assertEqual(a.lookup(tokens), [])
            ids = a.alloc(3)
            for j, block in enumerate(ids):
                for layer in range(geo["layers"]):
                    for kv in (0, 1):
                        view = a.block_view(layer, kv, block)
                        self.assertEqual(len(view), geo["slot_bytes"])
                        view[:] = bytes([(j * 7 + layer * 3 + kv) & 0xFF]) * len(view)
            self.assertEqual(a.commit(tokens, ids), ids)
            got = b.lookup(tokens, pin=True)
            self.assertEqual(got, ids)
            for j, block in enumerate(got):
                for layer in range(geo["layers"]):
                    for kv in (0, 1):
                        expect = bytes([(j * 7 + layer * 3 + kv) & 0xFF]) * geo["slot_bytes"]
                        self.assertEqual(bytes(b.block_view(layer, kv, block)), expect)
            # The copy functions see the same bytes (they also work for cuda).
            b.block_write(1, 1, got[2], b"\x5a" * 8)
            self.assertEqual(bytes(a.block_view(1, 1, got[2])[:8]), b"\x5a" * 8)
            self.assertEqual(a.block_read(1, 1, got[2], 8), b"\x5a" * 8)
            with self.assertRaises(kvshare.KvsError):
                a.block_read(0, 2, got[0])
            # Half the prefix hits half.
            self.assertEqual(b.lookup(tokens[:BT] + [1, 2, 3, 4], pin=False), ids[:1])
            st = a.stats()
            self.assertEqual(st["pinned_blocks"], 3)
            self.assertEqual(st["cached_blocks"], 3)
            self.assertEqual(st["free_blocks"] + st["writing_blocks"] + st["cached_blocks"],
                             st["total_blocks"])
            self.assertEqual(st["namespaces"][0]["name"], "default")
            self.assertEqual(b.release(got), 3)
            self.assertEqual(a.release(ids), 3)
            self.assertEqual(a.stats()["pinned_blocks"], 0)
            rows = a.tree()
            self.assertGreaterEqual(len(rows), 1)
            self.assertEqual(rows[0]["ns"], "default")
            self.assertGreater(a.ping(128), 0)

    def test_wait_for_prefix_in_flight(self):
        tokens = list(range(5000, 5000 + 2 * BT))
        with self.client(worker_name="A") as a, self.client(worker_name="B") as b:
            ids = a.alloc(2, ns="chat", tokens=tokens, first_block=0)
            self.assertEqual(b.lookup_inflight(tokens, ns="chat", pin=False), ([], 2))
            got = {}
            waiter = threading.Thread(
                target=lambda: got.setdefault("ids", b.lookup(tokens, ns="chat", wait_ms=20000)))
            waiter.start()
            # Parked or not yet sent, the lookup ends with the commit's blocks
            # (tests/daemon/test_session.c checks the parking step by step).
            a.commit(tokens, ids, ns="chat", priority=90)
            waiter.join(30)
            self.assertFalse(waiter.is_alive())
            self.assertEqual(got["ids"], ids)
            b.release(ids, priority=0, duration_ms=1000)
            a.release(ids)
            # The highest live hint counts: every block in the 75-100 band.
            chat = [n for n in a.stats()["namespaces"] if n["name"] == "chat"][0]
            self.assertEqual(chat["cached_by_priority"],
                             {"0-24": 0, "25-49": 0, "50-74": 0, "75-100": len(ids)})
            self.assertEqual(sum(chat["evicted_by_priority"].values()), 0)
            with self.assertRaises(kvshare.KvsError) as cm:
                a.pin(ids, priority=101)
            self.assertEqual(cm.exception.name, "KVS_EINVAL")

    def test_tier2_in_place(self):
        # A daemon with a tier 2 as large as its pool: the first prompt is
        # demoted when two more fill the pool, and a reader that maps tier 2
        # reads it there.
        self.assertEqual(self.daemon.stop(), 0)
        g = kvsd.GEOMETRY
        block_bytes = 2 * g["layers"] * BT * g["kv_heads"] * g["head_dim"] * 2  # fp16
        self.daemon = kvsd.Daemon(blocks=POOL, extra=("--host-tier", str(POOL * block_bytes)))
        nb = POOL // 2
        prompts = [list(range(s * 100000, s * 100000 + nb * BT)) for s in (1, 2, 3)]
        with self.client(worker_name="W") as w, \
                self.client(worker_name="R", map_tier2=True) as r:
            geo = r.geometry
            self.assertEqual(geo["tier2_blocks"], POOL)
            self.assertNotEqual(r.tier2_base, 0)
            self.assertEqual(w.tier2_base, 0)
            for s, tokens in enumerate(prompts):
                ids = w.alloc(nb)
                for j, block in enumerate(ids):
                    w.block_write(0, 1, block, bytes([s, j]) * 8)
                self.assertEqual(w.commit(tokens, ids), ids)
                w.release(ids)
            got = r.lookup_tier2(prompts[0])
            self.assertEqual([t for t, _ in got], [2] * nb)
            for j, (_, block) in enumerate(got):
                self.assertEqual(r.tier2_block_read(0, 1, block, 16), bytes([0, j]) * 8)
            self.assertEqual(r.lookup_tier2(prompts[2]), [(1, b) for b in r.lookup(prompts[2])])
            st = w.stats()
            self.assertEqual(st["tier_promotions"], 0)
            self.assertEqual(st["tier2_in_place_blocks"], nb)
            self.assertEqual(st["pinned_blocks"], 2 * nb)
            self.assertEqual(r.release_tiers(got), nb)
            self.assertEqual(r.release(r.lookup(prompts[2], pin=False) * 2), 2 * nb)
            self.assertEqual(w.stats()["pinned_blocks"], 0)
            with self.assertRaises(kvshare.KvsError) as e:
                r.release_tiers(got[:1])
            self.assertEqual(e.exception.status, kvshare.STATUS["ENOTHELD"])

    def test_errors_carry_messages(self):
        with self.client() as a:
            with self.assertRaises(kvshare.KvsError) as cm:
                a.release([812])
            self.assertEqual(cm.exception.name, "KVS_EINVAL")
            self.assertIn("block 812 is out of range", cm.exception.message)
            ids = a.alloc(1)
            a.release(ids)
            with self.assertRaises(kvshare.KvsError) as cm:
                a.release(ids)
            self.assertEqual(cm.exception.status, kvshare.STATUS["ENOTHELD"])
            with self.assertRaises(kvshare.KvsError) as cm:
                a.alloc(POOL + 1)
            self.assertEqual(cm.exception.name, "KVS_EINVAL")

    def test_miss_while_daemon_is_down(self):
        c = self.client(map_pool=False)
        self.assertEqual(self.daemon.stop(), 0)
        self.assertEqual(c.lookup(list(range(16))), [])
        self.assertFalse(c.connected)
        self.assertIn("is kvshared running?", c.last_error)
        c.close()
        self.daemon = Daemon()  # for tearDown

    def test_identity(self):
        """Client(identity=...) declares the model in Hello: a namespace that
        holds nothing takes it, identity() gives the daemon's text and hash;
        the same model again shares the namespace's blocks; another model is
        refused with KVS_EIDENTITY and both identities named (raised at
        connect, or kept by a lazy client, whose calls fail so)."""
        from ctypes import sizeof
        self.assertEqual(sizeof(kvshare._Identity), 104)  # kvs_identity_t on LP64
        base = dict(ns="ident", model="org/base-7b", revision="abc123",
                    dtype=kvsd.GEOMETRY["dtype"], layers=kvsd.GEOMETRY["layers"],
                    block_tokens=BT)
        tokens = list(range(900, 900 + BT))
        with self.client(identity=base) as a:
            text, h = a.identity()
            self.assertIn("model=org/base-7b", text)
            self.assertIn("revision=abc123", text)
            self.assertIn(kvsd.GEOMETRY["dtype"], text)
            self.assertNotEqual(h, 0)
            a.release(a.commit(tokens, a.alloc(1, ns="ident"), ns="ident"))
        with self.client(identity=kvshare.Identity(**base)) as b:
            self.assertEqual(b.identity(), (text, h))
            self.assertEqual(len(b.lookup(tokens, ns="ident", pin=False)), 1)
        tuned = dict(base, model="org/base-7b-finetune")
        with self.assertRaises(kvshare.KvsError) as cm:
            self.client(identity=tuned)
        self.assertEqual(cm.exception.status, kvshare.STATUS["EIDENTITY"])
        self.assertIn("org/base-7b-finetune", cm.exception.message)
        self.assertIn("model=org/base-7b'", cm.exception.message)
        lazy = self.client(identity=tuned, lazy=True)
        self.assertFalse(lazy.connected)
        self.assertIn("org/base-7b-finetune", lazy.last_error)
        with self.assertRaises(kvshare.KvsError) as cm:
            lazy.lookup(tokens, ns="ident")  # a refusal is not a miss: it raises
        self.assertEqual(cm.exception.status, kvshare.STATUS["EIDENTITY"])
        lazy.close()
        # The fine-tune in a namespace of its own: not the base model's blocks.
        with self.client(identity=dict(tuned, ns="ident-ft")) as c:
            self.assertIn("model=org/base-7b-finetune", c.identity()[0])
            self.assertEqual(c.lookup(tokens, ns="ident-ft", pin=False), [])
        with self.client() as plain:
            with self.assertRaises(kvshare.KvsError) as cm:
                plain.identity()
            self.assertEqual(cm.exception.status, kvshare.STATUS["ENOTFOUND"])
        with self.assertRaises(TypeError):
            kvshare.Identity.of({"model": "m", "heads": 2})
        with self.assertRaises(ValueError):
            kvshare.Identity(model="")

    def test_connect_failure_raises(self):
        with self.assertRaises(kvshare.KvsError) as cm:
            kvshare.Client(socket_path=self.daemon.socket + ".nope")
        self.assertEqual(cm.exception.name, "KVS_ENOTCONN")

    def test_breaker(self):
        # breaker=True: a hung daemon costs one timeout, then every call is a
        # miss at once until a background probe is answered.
        with self.client() as plain:
            self.assertEqual(plain.breaker(), {"state": "up", "trips": 0, "probes": 0,
                                               "fast_fails": 0, "down_ms": 0})
        tokens = list(range(900, 900 + 2 * BT))
        pid = self.daemon.proc.pid
        with kvshare.Client(socket_path=self.daemon.socket, timeout_ms=500,
                            breaker=True) as c:
            canon = c.commit(tokens, c.alloc(2))
            c.release(canon)
            os.kill(pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                self.assertEqual(c.lookup(tokens), [])
                self.assertGreaterEqual(time.monotonic() - t0, 0.4)
                st = c.breaker()
                self.assertEqual((st["state"], st["trips"]), ("down", 1))
                for _ in range(20):
                    t0 = time.monotonic()
                    self.assertEqual(c.lookup(tokens), [])
                    self.assertLess(time.monotonic() - t0, 0.05)
                with self.assertRaises(kvshare.KvsError) as cm:
                    c.alloc(1)
                self.assertEqual(cm.exception.name, "KVS_ENOTCONN")
                self.assertIn("is down", cm.exception.message)
                self.assertEqual(c.breaker()["fast_fails"], 21)
            finally:
                os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 20
            while c.breaker()["state"] != "up":
                self.assertLess(time.monotonic(), deadline, "the breaker stayed down")
                time.sleep(0.005)
            self.assertEqual(c.lookup(tokens), canon)
            c.release(canon)
            st = c.breaker()
            self.assertEqual((st["trips"], st["down_ms"]), (1, 0))
            self.assertGreaterEqual(st["probes"], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
