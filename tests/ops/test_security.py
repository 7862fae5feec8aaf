# SPDX-License-Identifier: Apache-2.0
"""Socket mode and group, peer credentials and allow-lists, namespace
isolation (Pin by id, Stats, Tree, Lookup) for a peer not allowed."""
import os
import signal
import stat
import time
import unittest

from ops_daemon import BT, Daemon, kvshare, metric, parse_metrics

NOBODY = 4242424  # a uid and gid no test process has


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class SocketTest(unittest.TestCase):
    def test_mode_and_group(self):
        gid = os.getgid()
        d = Daemon(blocks=16, config="socket_group = %d\ndynamic_namespaces = yes\n" % gid,
                   metrics=False)
        try:
            st = os.stat(d.socket)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o660)
            self.assertEqual(st.st_gid, gid)
        finally:
            self.assertEqual(d.stop(), 0)


class PeerTest(unittest.TestCase):
    def test_peer_not_allowed_is_refused(self):
        d = Daemon(blocks=16, extra=["--allow-uids", str(NOBODY), "--log-level", "info"])
        try:
            with self.assertRaises(kvshare.KvsError) as e:
                kvshare.Client(socket_path=d.socket, map_pool=False)
            self.assertEqual(e.exception.status, kvshare.STATUS["EDENIED"], str(e.exception))
            self.assertTrue(wait_for(lambda: "refused pid" in d.log()))
            self.assertIn("uid %d" % os.getuid(), d.log())
            m = parse_metrics(d.scrape())
            self.assertEqual(metric(m, "kvshare_sessions_refused_total", reason="denied"), 1)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_allowed_peer_is_logged(self):
        d = Daemon(blocks=16, extra=["--allow-uids", "%d,%d" % (NOBODY, os.getuid()),
                                     "--log-level", "info"], metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False, worker_name="w1") as c:
                self.assertEqual(c.lookup([1] * BT, pin=False), [])
            log = d.log()
            self.assertIn("connected: pid %d, uid %d" % (os.getpid(), os.getuid()), log)
            self.assertIn("hello from 'w1', pid %d" % os.getpid(), log)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_allowed_by_group(self):
        d = Daemon(blocks=16, extra=["--allow-uids", str(NOBODY), "--allow-gids",
                                     str(os.getgid())], metrics=False)
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                self.assertEqual(c.lookup([1] * BT, pin=False), [])
        finally:
            self.assertEqual(d.stop(), 0)


class IsolationTest(unittest.TestCase):
    def test_namespace_not_allowed_is_invisible_and_untouchable(self):
        d = Daemon(blocks=32, config="[namespace secret]\n[namespace open]\n")
        try:
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                secret_tokens = list(range(100, 100 + 4 * BT))
                open_tokens = list(range(900, 900 + 4 * BT))
                secret = c.commit(secret_tokens, c.alloc(4, ns="secret"), ns="secret")
                opened = c.commit(open_tokens, c.alloc(4, ns="open"), ns="open")
                c.release(secret + opened)
                # The operator restricts "secret" to another uid and reloads.
                with open(d.config, "w") as f:
                    f.write("[namespace secret]\nallow_uids = %d\n[namespace open]\n" % NOBODY)
                d.proc.send_signal(signal.SIGHUP)
                self.assertTrue(wait_for(lambda: metric(parse_metrics(d.scrape()),
                                                        "kvshare_config_reloads_total",
                                                        result="ok") == 1))
            with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
                with self.assertRaises(kvshare.KvsError) as e:
                    c.lookup(secret_tokens, ns="secret", pin=False)
                self.assertEqual(e.exception.status, kvshare.STATUS["EDENIED"])
                with self.assertRaises(kvshare.KvsError) as e:
                    c.alloc(1, ns="secret")
                self.assertEqual(e.exception.status, kvshare.STATUS["EDENIED"])
                # Pin, Release and Commit by block id: a secret block is
                # answered exactly as a free one (before, EDENIED against
                # ENOTFOUND told the two apart), an open one is pinned.
                free = [b for b in range(32) if b not in secret + opened][0]

                def answer(call, block):
                    with self.assertRaises(kvshare.KvsError) as e:
                        call(block)
                    return (e.exception.status,
                            e.exception.message.replace("block %d " % block, "block N "))
                for call in (lambda b: c.pin([b]), lambda b: c.release([b]),
                             lambda b: c.commit(list(range(BT)), [b], ns="open")):
                    self.assertEqual(answer(call, secret[0]), answer(call, free))
                self.assertEqual(answer(lambda b: c.pin([b]), free)[0],
                                 kvshare.STATUS["ENOTFOUND"])
                self.assertEqual(c.pin(opened[:1]), 1)
                c.release(opened[:1])
                # Stats and Tree show only what this peer may use.
                names = [n["name"] for n in c.stats()["namespaces"]]
                self.assertIn("open", names)
                self.assertNotIn("secret", names)
                rows = c.tree(max_rows=50)
                self.assertTrue(rows)
                self.assertEqual({r["ns"] for r in rows}, {"open"})
                with self.assertRaises(kvshare.KvsError) as e:
                    c.tree(ns="secret")
                self.assertEqual(e.exception.status, kvshare.STATUS["EDENIED"])
                # Its own namespace still works; the secret blocks are intact.
                self.assertEqual(len(c.lookup(open_tokens, ns="open", pin=False)), 4)
            m = parse_metrics(d.scrape())
            self.assertEqual(metric(m, "kvshare_namespace_cached_blocks", namespace="secret"), 4)
            self.assertGreaterEqual(metric(m, "kvshare_namespace_denied_total"), 3)
        finally:
            self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
