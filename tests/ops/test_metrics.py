# SPDX-License-Identifier: Apache-2.0
"""Prometheus metrics over HTTP, scraped by real HTTP clients (curl and
urllib), against `kvshare stats --json` from the same daemon."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import unittest
import urllib.error
import urllib.request

from ops_daemon import BT, Daemon, kvshare, metric, parse_metrics


def cli(*args):
    return subprocess.run([os.environ["KVSHARE_CLI"]] + list(args),
                          capture_output=True, text=True, timeout=60)


class MetricsTest(unittest.TestCase):
    def setUp(self):
        extra = ()
        if self._testMethodName == "test_scrape_matches_stats":
            # A 1-block quota and a writing limit above what traffic() holds
            # at once (12 + 1), so the refusals it counts are its own.
            extra = ("--namespace", "tenant-q:1", "--session-max-writing", "13")
        self.d = Daemon(blocks=16, extra=extra)

    def tearDown(self):
        self.assertEqual(self.d.stop(), 0)

    def traffic(self):
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            tokens = list(range(1000, 1000 + 4 * BT))
            ids = c.alloc(4, ns="tenant-a")
            c.commit(tokens, ids, ns="tenant-a")
            self.assertEqual(len(c.lookup(tokens, ns="tenant-a", pin=False)), 4)
            self.assertEqual(len(c.lookup(tokens[:2 * BT] + [7] * BT, ns="tenant-a",
                                          pin=False)), 2)
            c.lookup([5] * (3 * BT), ns="tenant-b", pin=False)
            held = c.alloc(12)  # the rest of the pool; the cached 4 stay pinned
            with self.assertRaises(kvshare.KvsError):
                c.alloc(1)  # pool full: every block is writing or pinned
            c.release(held)
            c.release(ids)

    def refusals(self):
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            with self.assertRaises(kvshare.KvsError):
                c.alloc(14)  # over session_max_writing
            q = c.alloc(2, ns="tenant-q")
            with self.assertRaises(kvshare.KvsError):
                c.commit(list(range(50, 50 + 2 * BT)), q, ns="tenant-q")  # quota of 1 block
            c.release(q)

    def test_scrape_matches_stats(self):
        self.traffic()
        self.refusals()
        r = cli("stats", "--json", "--socket", self.d.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        curl = shutil.which("curl")
        if curl:
            # curl is not ours: without the sanitizer runtimes a sanitizer
            # build preloads into this test.
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            text = subprocess.run([curl, "-sf", "--max-time", "20", self.d.url()],
                                  capture_output=True, text=True, timeout=30, check=True,
                                  env=env).stdout
        else:
            text = self.d.scrape()
        m = parse_metrics(text)
        b = s["blocks"]
        self.assertEqual(metric(m, "kvshare_blocks", state="free"), b["free"])
        self.assertEqual(metric(m, "kvshare_blocks", state="writing"), b["writing"])
        self.assertEqual(metric(m, "kvshare_blocks", state="cached"), b["cached"])
        self.assertEqual(metric(m, "kvshare_blocks", state="pinned"), b["pinned"])
        self.assertEqual(b["cached"], 5)  # 4 of tenant-a, 1 under tenant-q's quota
        self.assertEqual(metric(m, "kvshare_pool_blocks"), b["total"])
        self.assertAlmostEqual(metric(m, "kvshare_kv_cache_usage_perc"),
                               (b["total"] - b["free"]) / b["total"], places=5)
        self.assertEqual(metric(m, "kvshare_evictions_total"), s["evictions"])
        self.assertEqual(metric(m, "kvshare_alloc_failures_total", reason="pool_full"),
                         s["alloc_failures"])
        self.assertEqual(s["alloc_failures"], 1)
        self.assertEqual(metric(m, "kvshare_alloc_failures_total", reason="quota"),
                         s["alloc_failures_quota"])
        self.assertEqual(s["alloc_failures_quota"], 1)
        self.assertEqual(metric(m, "kvshare_session_limit_refusals_total"),
                         s["session_limit_refusals"])
        self.assertEqual(s["session_limit_refusals"], 1)
        # No allow-list, session cap, slow reader or reload here: these
        # compare zeros.
        for name, labels, key in (
                ("kvshare_sessions_refused_total", {"reason": "limit"}, "sessions_refused"),
                ("kvshare_sessions_refused_total", {"reason": "denied"}, "peers_denied"),
                ("kvshare_sessions_dropped_total", {}, "sessions_dropped"),
                ("kvshare_namespace_denied_total", {}, "namespace_denied"),
                ("kvshare_config_reloads_total", {"result": "ok"}, "config_reloads"),
                ("kvshare_config_reloads_total", {"result": "error"}, "config_reload_errors")):
            self.assertEqual(metric(m, name, **labels), s[key], name)
            self.assertEqual(s[key], 0, key)
        self.assertEqual(metric(m, "kvshare_sessions_total"), s["sessions_total"])
        self.assertEqual(metric(m, "kvshare_sessions"), 0)
        # The Stats request itself is counted once it is answered.
        self.assertEqual(metric(m, "kvshare_requests_total"), s["requests"] + 1)
        self.assertEqual(metric(m, "kvshare_request_errors_total"), s["errors"])
        for ns in s["namespaces"]:
            self.assertEqual(metric(m, "kvshare_prefix_cache_queries_total",
                                    namespace=ns["name"]), ns["lookup_tokens"])
            self.assertEqual(metric(m, "kvshare_prefix_cache_hits_total",
                                    namespace=ns["name"]), ns["hit_tokens"])
            self.assertEqual(metric(m, "kvshare_namespace_cached_blocks",
                                    namespace=ns["name"]), ns["cached_blocks"])
            self.assertEqual(metric(m, "kvshare_namespace_reserved_blocks",
                                    namespace=ns["name"]), ns["reserve"])
            for cause in ("own", "others", "quota"):
                self.assertEqual(metric(m, "kvshare_namespace_evictions_total",
                                        namespace=ns["name"], cause=cause),
                                 ns["evicted_" + cause])
            # No hints here: every block is in the default priority's band.
            bands = ("0-24", "25-49", "50-74", "75-100")
            self.assertEqual([metric(m, "kvshare_namespace_cached_blocks_by_priority",
                                     namespace=ns["name"], band=b) for b in bands],
                             [0, 0, ns["cached_blocks"], 0])
            self.assertEqual(sum(metric(m, "kvshare_namespace_evicted_blocks_by_priority_total",
                                        namespace=ns["name"], band=b) for b in bands),
                             ns["evicted_blocks"])
            # The Stats reply carries the same counts.
            for b in bands:
                self.assertEqual(metric(m, "kvshare_namespace_cached_blocks_by_priority",
                                        namespace=ns["name"], band=b),
                                 ns["cached_by_priority"][b])
                self.assertEqual(metric(m, "kvshare_namespace_evicted_blocks_by_priority_total",
                                        namespace=ns["name"], band=b),
                                 ns["evicted_by_priority"][b])
        self.assertEqual(metric(m, "kvshare_prefix_cache_queries_total", namespace="tenant-a"),
                         7 * BT)
        self.assertEqual(metric(m, "kvshare_prefix_cache_hits_total", namespace="tenant-a"),
                         6 * BT)
        self.assertEqual(metric(m, "kvshare_prefix_cache_hits_total", namespace="tenant-b"), 0)
        # Histograms: one latency observation per request; one reuse gap
        # per lookup that hits (2 of 3); none evicted yet.
        self.assertEqual(metric(m, "kvshare_rpc_duration_seconds_count", rpc="Lookup"), 3)
        self.assertEqual(metric(m, "kvshare_rpc_duration_seconds_bucket", rpc="Lookup",
                                le="+Inf"), 3)
        self.assertEqual(metric(m, "kvshare_rpc_duration_seconds_count", rpc="Alloc"), 5)
        self.assertEqual(metric(m, "kvshare_block_reuse_gap_seconds_count"), 2)
        self.assertEqual(metric(m, "kvshare_block_lifetime_seconds_count"), 0)

    def test_counters_everywhere(self):
        """Every counter the library knows (kvshare_counters.h, through
        kvs_counter_name) is in the Python binding's stats, in `kvshare stats
        --json` and in its text, with the same value in each."""
        self.traffic()
        names = kvshare.counter_names()
        self.assertGreaterEqual(len(names), 16)
        self.assertEqual(len(set(names)), len(names))
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            py = c.stats()
        r = cli("stats", "--json", "--socket", self.d.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        js = json.loads(r.stdout)
        t = cli("stats", "--socket", self.d.socket)
        self.assertEqual(t.returncode, 0, t.stderr)
        text = {}
        for line in t.stdout.splitlines():
            words = line.split()
            for key, value in zip(words[0::2], words[1::2]):
                if key in names:
                    text[key] = int(value)
        # Gauges and counters are the binding's keys, nothing else.
        gauges = {"total_blocks", "free_blocks", "writing_blocks", "cached_blocks",
                  "pinned_blocks", "sessions", "block_tokens", "backend", "block_bytes",
                  "pool_bytes", "index_bytes", "uptime_ms", "namespaces",
                  "tier2_total_blocks", "tier2_cached_blocks", "copying_blocks", "copy_path",
                  "devices", "tier3_total_blocks", "tier3_cached_blocks", "disk_io",
                  "cluster_nodes", "loop_busy_max_us"}
        self.assertEqual(set(py), gauges | set(names))
        # Each query is a session and a request of its own: those move, and
        # so may the loop's longest work so far (any query can be it).
        moving = {"requests", "bytes_in", "bytes_out", "sessions_total"}
        for name in names:
            self.assertIn(name, js, name)
            self.assertIn(name, text, name)
            if name not in moving:
                self.assertEqual(js[name], py[name], name)
                self.assertEqual(text[name], py[name], name)
        self.assertEqual(py["alloc_failures"], 1)  # traffic()'s pool-full Alloc
        self.assertEqual(js["blocks"]["cached"], py["cached_blocks"])
        self.assertEqual(js["block_bytes"], py["block_bytes"])
        self.assertEqual(js["sessions_total"], py["sessions_total"] + 1)

    def test_pin_misses(self):
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            with self.assertRaises(kvshare.KvsError) as e:
                c.pin([3])  # never committed: not cached
            self.assertEqual(e.exception.name, "KVS_ENOTFOUND")
            self.assertEqual(c.stats()["pin_misses"], 1)
        self.assertEqual(metric(parse_metrics(self.d.scrape()), "kvshare_pin_misses_total"), 1)

    def test_lifetime_after_eviction(self):
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            ids = c.alloc(4)
            c.commit(list(range(4 * BT)), ids)
            c.release(ids)
            c.release(c.alloc(16))  # evicts the 4 cached blocks
        m = parse_metrics(self.d.scrape())
        self.assertEqual(metric(m, "kvshare_evictions_total"), 4)
        self.assertEqual(metric(m, "kvshare_block_lifetime_seconds_count"), 4)
        self.assertEqual(metric(m, "kvshare_block_lifetime_seconds_bucket", le="+Inf"), 4)

    def test_not_found_and_method(self):
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(self.d.url("/"), timeout=10)
        self.assertEqual(e.exception.code, 404)
        req = urllib.request.Request(self.d.url(), data=b"x", method="POST")
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        self.assertEqual(e.exception.code, 405)

    def raw(self, request):
        with socket.create_connection(("127.0.0.1", self.d.port), timeout=10) as s:
            s.sendall(request)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return data
                data += chunk

    def test_bare_lf_and_head(self):
        # Bare LF line ends (before: no answer until the timeout) and HEAD
        # (before: Content-Length 0) answer as GET does, HEAD without body.
        get = self.raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        lf = self.raw(b"GET /metrics HTTP/1.0\nHost: x\n\n")
        self.assertTrue(lf.startswith(b"HTTP/1.1 200"), lf[:100])
        self.assertIn(b"kvshare_pool_blocks 16", lf)
        head = self.raw(b"HEAD /metrics HTTP/1.1\r\n\r\n")
        headers, _, body = head.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head[:100])
        self.assertEqual(body, b"")
        length = int([h for h in headers.split(b"\r\n")
                      if h.lower().startswith(b"content-length:")][0].split(b":")[1])
        get_body = get.partition(b"\r\n\r\n")[2]
        # The scrapes differ only in counters that moved: same order of size.
        self.assertGreater(length, len(get_body) // 2)

    def test_oversized_request_and_idle_client_do_not_block(self):
        idle = socket.create_connection(("127.0.0.1", self.d.port), timeout=10)
        idle.sendall(b"GET /metr")  # never finishes its request
        big = socket.create_connection(("127.0.0.1", self.d.port), timeout=10)
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000)
        reply = big.recv(100)
        self.assertTrue(reply.startswith(b"HTTP/1.1 431"), reply)
        big.close()
        # The idle client holds a connection; the daemon still answers both
        # HTTP and its socket.
        self.assertIn("kvshare_pool_blocks 16", self.d.scrape())
        with kvshare.Client(socket_path=self.d.socket, map_pool=False) as c:
            self.assertEqual(c.lookup([1] * BT, pin=False), [])
        idle.close()

    def connect_idle(self):
        s = socket.create_connection(("127.0.0.1", self.d.port), timeout=10)
        s.sendall(b"GET /metr")  # never finishes its request
        return s

    def test_idle_connections_cannot_keep_scrapers_out(self):
        # Idle connections up to the limit, renewed as the daemon closes
        # them, let 1 of 30 scrapes through before: a new connection was
        # closed at the limit. Now it closes the oldest idle one instead.
        idle = [self.connect_idle() for _ in range(64)]
        ok = 0
        try:
            for _ in range(30):
                try:
                    if "kvshare_pool_blocks 16" in self.d.scrape():
                        ok += 1
                except OSError:
                    pass
                idle.append(self.connect_idle())  # the attacker renews
        finally:
            for s in idle:
                s.close()
        self.assertEqual(ok, 30)
        # Each renewal closed one idle connection: at the limit, or (on a
        # slow machine, where connecting 64 took seconds) at its deadline.
        m = parse_metrics(self.d.scrape())
        limit = metric(m, "kvshare_metrics_http_closed_total", reason="limit")
        deadline = metric(m, "kvshare_metrics_http_closed_total", reason="deadline")
        self.assertGreaterEqual(limit, 1)
        self.assertGreaterEqual(limit + deadline, 30)

    def test_head_deadline(self):
        # A connection that never completes its head is closed within
        # METRICS_HTTP_HEAD_MS (2 s; it was 5 s) and counted.
        s = self.connect_idle()
        t0 = time.monotonic()
        s.settimeout(10)
        self.assertEqual(s.recv(100), b"")
        took = time.monotonic() - t0
        s.close()
        self.assertLess(took, 3.5)
        self.assertGreaterEqual(took, 1.5)
        m = parse_metrics(self.d.scrape())
        self.assertEqual(metric(m, "kvshare_metrics_http_closed_total", reason="deadline"), 1)

    def test_parallel_scrapes_share_renders(self):
        # 16 scrapers at once: each is answered in full, and those that come
        # within 19 renders' time of the last render wait for the next and
        # share it (before, each rendered on the loop in turn).
        import threading
        bodies, errors = [], []
        stop = time.monotonic() + 1.5

        def scraper():
            while time.monotonic() < stop:
                try:
                    bodies.append(self.d.scrape())
                except OSError as e:
                    errors.append(e)

        threads = [threading.Thread(target=scraper) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(len(bodies), 16)
        self.assertTrue(all("kvshare_pool_blocks 16" in b for b in bodies))
        m = parse_metrics(self.d.scrape())
        self.assertGreater(metric(m, "kvshare_metrics_http_scrapes_held_total"), 0)
        print("%d scrapes, %d held for a shared render" %
              (len(bodies), metric(m, "kvshare_metrics_http_scrapes_held_total")),
              file=sys.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
