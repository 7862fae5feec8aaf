# SPDX-License-Identifier: Apache-2.0
"""`promtool check metrics` on a real kvshared's /metrics: base units
(seconds, bytes), _total on counters and only on them, one HELP and TYPE per
family, the format itself. Run on a plain daemon and on one with every
optional section of the exposition (tier 2, tier 3 on disk, a cluster tier
whose seed does not answer: its families are rendered all the same), each
after some traffic so that histograms and labelled series have samples.
Skipped, with the reason printed, only when promtool is missing (Debian's
prometheus package; tools/install-deps.sh installs it)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from ops_daemon import BT, Daemon, kvshare

SKIP = 77


def promtool():
    return os.environ.get("PROMTOOL") or shutil.which("promtool")


class ExpositionTest(unittest.TestCase):
    def check(self, d):
        with kvshare.Client(socket_path=d.socket, map_pool=False) as c:
            tokens = list(range(100, 100 + 4 * BT))
            ids = c.alloc(4, ns="chat")
            c.commit(tokens, ids, ns="chat")
            c.release(ids)
            self.assertEqual(len(c.lookup(tokens, ns="chat", pin=False)), 4)
            c.lookup([9] * (2 * BT), ns="batch", pin=False)
        text = d.scrape()
        r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        # promtool prints each finding and exits 0 only when there are none.
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))
        families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        for family in ("process_start_time_seconds", "process_cpu_seconds_total",
                       "process_resident_memory_bytes", "process_virtual_memory_bytes",
                       "process_open_fds", "process_max_fds", "kvshare_loop_busy_max_seconds",
                       "kvshare_lookup_wait_seconds_total", "kvshare_tier_copy_seconds_total"):
            self.assertIn(family, families)
        return families

    def test_plain_daemon(self):
        d = Daemon(blocks=64)
        try:
            self.check(d)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_every_optional_section(self):
        disk = tempfile.mkdtemp(prefix="kvs-t3-")
        self.addCleanup(shutil.rmtree, disk, True)
        d = Daemon(blocks=64, extra=(
            "--host-tier", "1M", "--disk-tier-path", os.path.join(disk, "tier3.dat"),
            "--disk-tier-bytes", "4M", "--cluster-seeds", "127.0.0.1:1"))
        try:
            families = self.check(d)
            for family in ("kvshare_tier3_slots", "kvshare_tier3_read_seconds",
                           "kvshare_cluster_node_latency_seconds_total",
                           "kvshare_cluster_node_command_errors_total",
                           "kvshare_cluster_fetch_seconds", "kvshare_cluster_settings_warnings"):
                self.assertIn(family, families)
        finally:
            self.assertEqual(d.stop(), 0)


if __name__ == "__main__":
    if not promtool():
        print("skipped: promtool not found (Debian's prometheus package; "
              "tools/install-deps.sh installs it), or set PROMTOOL")
        sys.exit(SKIP)
    unittest.main(verbosity=2)
