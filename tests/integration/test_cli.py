# SPDX-License-Identifier: Apache-2.0
"""The kvshare CLI's daemon commands (stats, top, tree, ping) against a real
kvshared. Run by ctest with KVSHARED and KVSHARE_CLI in the environment."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "client"))
from test_python import Daemon  # noqa: E402  (same daemon launcher)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "support"))
import kvsd  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "..", "client", "python"))
import kvshare  # noqa: E402


def cli(*args):
    # A generous per-call timeout: sanitizer builds on a busy machine are slow.
    args = list(args) + ["--timeout", "20000"]
    return subprocess.run([os.environ["KVSHARE_CLI"]] + list(args),
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8"))


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        # Some traffic so that every view has something to show.
        with kvshare.Client(socket_path=cls.daemon.socket, map_pool=False,
                            timeout_ms=20000) as c:
            tokens = list(range(100, 100 + 4 * 4))
            ids = c.alloc(4)
            c.commit(tokens, ids, ns="tenant-a")
            c.lookup(tokens, ns="tenant-a", pin=False)
            c.lookup(tokens[:8] + [1] * 8, ns="tenant-a", pin=False)
            c.release(ids)

    @classmethod
    def tearDownClass(cls):
        assert cls.daemon.stop() == 0

    def test_stats_json(self):
        r = cli("stats", "--json", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        b = s["blocks"]
        self.assertEqual(b["free"] + b["writing"] + b["cached"], b["total"])
        self.assertEqual(b["cached"], 4)
        ns = {n["name"]: n for n in s["namespaces"]}
        self.assertEqual(ns["tenant-a"]["lookups"], 2)
        self.assertEqual(ns["tenant-a"]["hit_tokens"], 16 + 8)
        self.assertAlmostEqual(ns["tenant-a"]["hit_rate"], 24 / 32, places=3)
        for key in ("reserve", "evicted_own", "evicted_others", "evicted_quota"):
            self.assertEqual(ns["tenant-a"][key], 0, key)
        # No hints: the default priority, 50.
        self.assertEqual(ns["tenant-a"]["cached_by_priority"],
                         {"0-24": 0, "25-49": 0, "50-74": 4, "75-100": 0})
        self.assertEqual(ns["tenant-a"]["evicted_by_priority"],
                         {"0-24": 0, "25-49": 0, "50-74": 0, "75-100": 0})

    def test_stats_human(self):
        r = cli("stats", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("blocks    free", r.stdout)
        self.assertIn("tenant-a", r.stdout)
        self.assertIn("75.0%", r.stdout)
        # The counters stand in two aligned columns, whatever the length of
        # the longest name: every name starts, and every value ends, at the
        # same column as the others of its column.
        lines = r.stdout.split("\n")
        first = lines.index("counters since start") + 1
        rows = lines[first:lines.index("", first)]
        self.assertGreater(len(rows), 10)
        names, ends = set(), set()
        for row in rows:
            for m in re.finditer(r"([a-z][a-z0-9_]*) +(\d+)", row):
                names.add(m.start(1))
                ends.add(m.end(2))
        self.assertEqual(len(names), 2, "\n".join(rows))
        self.assertEqual(len(ends), 2, "\n".join(rows))

    def test_devices(self):
        """kvshared --devices 0-1: stats lists each device (human and JSON)
        with its rank's worker and the shards still being written; top's
        JSON carries them too."""
        d = kvsd.Daemon(blocks=16, extra=("--devices", "0-1"))
        try:
            with kvshare.Client(socket_path=d.socket, rank=0, timeout_ms=20000) as r0:
                tokens = list(range(200, 200 + 2 * 4))
                ids = r0.alloc(2)
                self.assertEqual(r0.commit_group(tokens, ids), ([], 2))
                r = cli("stats", "--json", "--socket", d.socket)
                self.assertEqual(r.returncode, 0, r.stderr)
                devs = json.loads(r.stdout)["devices"]
                self.assertEqual([(x["rank"], x["ordinal"], x["workers"], x["shards_written"],
                                   x["shards_missing"]) for x in devs],
                                 [(0, 0, 1, 2, 0), (1, 1, 0, 0, 2)])
                self.assertGreater(devs[0]["used_bytes"], 0)
                t = cli("stats", "--socket", d.socket)
                self.assertEqual(t.returncode, 0, t.stderr)
                self.assertIn("DEVICE RANK", t.stdout)
                rows = [line.split() for line in t.stdout.splitlines()
                        if line.startswith(("0 ", "1 "))]
                self.assertEqual([row[:2] for row in rows], [["0", "0"], ["1", "1"]])
                top = cli("top", "--once", "--json", "--socket", d.socket)
                self.assertEqual(top.returncode, 0, top.stderr)
                self.assertEqual([x["shards_missing"] for x in json.loads(top.stdout)["devices"]],
                                 [0, 2])
        finally:
            self.assertEqual(d.stop(), 0)

    def test_tree(self):
        r = cli("tree", "--json", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        ns = {n["name"]: n for n in json.loads(r.stdout)["namespaces"]}
        # One prompt of 4 blocks, looked up whole once and by its first half
        # once: one prefix (a lookup splits nothing), matched whole by one
        # of the two lookups.
        top = ns["tenant-a"]["prefixes"]
        self.assertEqual(len(top), 1)
        self.assertEqual((top[0]["tokens"], top[0]["blocks"], top[0]["hits"]), (16, 4, 1))
        self.assertEqual(top[0]["share"], 0.5)
        self.assertEqual(top[0]["children"], [])
        r = cli("tree", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.split("\n")
        self.assertTrue(lines[0].startswith(
            "namespace tenant-a: 2 lookups, 75.0% of tokens hit; 4 blocks held "
            "(reserve 0, quota none)"), lines[0])
        # Evictions by cause, and blocks by retention priority band (no
        # hints: the default priority, 50).
        self.assertEqual(lines[1], "  evicted 0 (for its own need 0, for others 0, at quota 0); "
                                   "cached by priority 0-24: 0 25-49: 0 50-74: 4 75-100: 0")
        h = lines.index(f"{'HITS':>10} {'SHARE':>6} {'BLOCKS':>7} {'IN T2':>6} {'PINS':>5}  "
                        "PREFIX (tokens)")
        self.assertEqual(lines[h + 1].split(), ["1", "50.0%", "4", "0", "0", "\u2514\u2500", "16"])
        self.assertEqual(lines[h + 2], "")
        r = cli("tree", "--ns", "nope", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 1)
        self.assertIn("unknown namespace 'nope'", r.stderr)

    def test_ping_and_top(self):
        r = cli("ping", "--count", "3", "--interval", "0", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("3 sent, 3 answered", r.stdout)
        r = cli("top", "--count", "2", "--interval", "0.1", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("lookups/s", r.stdout)

    def test_clear(self):
        with kvshare.Client(socket_path=self.daemon.socket, map_pool=False,
                            timeout_ms=20000) as c:
            tokens = list(range(500, 500 + 2 * 4))
            c.release(c.commit(tokens, c.alloc(2, ns="tenant-clear"), ns="tenant-clear"))
            r = cli("clear", "tenant-clear", "--socket", self.daemon.socket)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("namespace 'tenant-clear': 2 blocks dropped, 0 kept", r.stdout)
            self.assertEqual(c.lookup(tokens, ns="tenant-clear", pin=False), [])
        r = cli("clear", "no-such-ns", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 1)
        self.assertIn("unknown namespace 'no-such-ns'", r.stderr)
        r = cli("clear", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 2)
        self.assertIn("name the namespace", r.stderr)

    def test_evict(self):
        with kvshare.Client(socket_path=self.daemon.socket, map_pool=False,
                            timeout_ms=20000) as c:
            tokens = list(range(700, 700 + 3 * 4))
            c.release(c.commit(tokens, c.alloc(3, ns="tenant-evict"), ns="tenant-evict"))
            held = c.lookup(tokens[:4], ns="tenant-evict")  # the first block stays
            words = [str(t) for t in tokens]
            r = cli("evict", "tenant-evict", ",".join(words[:6]), *words[6:],
                    "--socket", self.daemon.socket)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("namespace 'tenant-evict': 2 blocks dropped (2 from the pool, "
                          "0 from tier 2), 1 kept", r.stdout)
            c.release(held)
            r = subprocess.run([os.environ["KVSHARE_CLI"], "evict", "tenant-evict", "--file",
                                "-", "--socket", self.daemon.socket, "--timeout", "20000"],
                               input=" ".join(words) + "\n", capture_output=True, text=True,
                               timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("1 blocks dropped (1 from the pool", r.stdout)
            self.assertEqual(c.lookup(tokens, ns="tenant-evict", pin=False), [])
        r = cli("evict", "no-such-ns", "1", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 1)
        self.assertIn("unknown namespace 'no-such-ns'", r.stderr)
        r = cli("evict", "tenant-evict", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 2)
        self.assertIn("name the namespace and the prompt", r.stderr)
        r = cli("evict", "tenant-evict", "12x", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 2)
        self.assertIn("'12x' is not a token id", r.stderr)

    def test_no_daemon_says_what_to_do(self):
        d = tempfile.mkdtemp()
        try:
            for cmd in ("stats", "top", "tree", "sessions", "ping", "clear x", "evict x 1"):
                r = cli(*cmd.split(), "--socket", os.path.join(d, "none.sock"))
                self.assertEqual(r.returncode, 1, cmd)
                self.assertIn("is kvshared running? no socket at", r.stderr)
        finally:
            shutil.rmtree(d)

    def test_bad_usage(self):
        r = cli("stats", "--bogus")
        self.assertEqual(r.returncode, 2)


class SystemSocketTest(unittest.TestCase):
    """Without --socket, when no daemon answers at the per-user default, the
    CLI tries the system daemon's socket (/run/kvshare/kvshared.sock, where
    the unit puts it; in this build of the CLI, a path under the build tree),
    and when none answers it names every path it tried."""

    def setUp(self):
        self.system = os.environ["KVSHARE_TEST_SYSTEM_SOCKET"]
        self.xdg = tempfile.mkdtemp(prefix="kvs-xdg-")
        self.user = os.path.join(self.xdg, "kvshare", "kvshared.sock")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        shutil.rmtree(self.xdg, ignore_errors=True)

    def run_cli(self, *args, **env):
        e = {k: v for k, v in os.environ.items() if k != "KVSHARE_SOCKET"}
        # XDG_RUNTIME_DIR: the per-user default, for root too.
        e.update(LANG="C.UTF-8", LC_ALL="C.UTF-8", XDG_RUNTIME_DIR=self.xdg, **env)
        return subprocess.run([os.environ["KVSHARE_CLI_SYSTEM_SOCKET"]] + list(args)
                              + ["--timeout", "20000"],
                              capture_output=True, text=True, timeout=120, env=e)

    def start(self, sock, blocks):
        self.daemons.append(kvsd.Daemon(blocks=blocks, dir=os.path.dirname(sock)))
        self.assertEqual(self.daemons[-1].socket, sock)

    def total_blocks(self, r):
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)["blocks"]["total"]

    def test_none_answers_names_each_path(self):
        r = self.run_cli("stats", "--json")
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("tried", r.stderr)
        self.assertIn(self.user, r.stderr)
        self.assertIn(self.system, r.stderr)

    def test_system_daemon_answers(self):
        self.start(self.system, 48)
        self.assertEqual(self.total_blocks(self.run_cli("stats", "--json")), 48)
        self.assertEqual(self.run_cli("ping", "--count", "1").returncode, 0)
        self.assertEqual(self.run_cli("top", "--once").returncode, 0)
        # $KVSHARE_SOCKET names one socket: no other is tried.
        r = self.run_cli("stats", KVSHARE_SOCKET=self.user)
        self.assertEqual(r.returncode, 1)
        self.assertNotIn(self.system, r.stderr)
        # A daemon at the per-user default comes first.
        self.start(self.user, 40)
        self.assertEqual(self.total_blocks(self.run_cli("stats", "--json")), 40)


if __name__ == "__main__":
    unittest.main(verbosity=2)
