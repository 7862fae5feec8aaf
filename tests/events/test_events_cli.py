# SPDX-License-Identifier: Apache-2.0
"""`kvshare events`: tails a live kvshared's KV events, as text and JSON, in
both event encodings; refuses bad options."""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ops"))
from ops_daemon import BT, Daemon, kvshare  # noqa: E402

CLI = os.environ["KVSHARE_CLI"]
PROBE = 1 << 20  # token ids of the probes, apart from the test's


def text_done(out):
    """Whether the text tail shows the test's BlockStored and 3 BlockRemoved."""
    lines = out.splitlines()
    first = [i for i, line in enumerate(lines) if "BlockStored 3 blocks" in line]
    return bool(first) and sum("BlockRemoved" in line for line in lines[first[0]:]) >= 3


def json_done(out):
    """Whether the JSON tail shows the test's BlockStored and its 3 blocks removed."""
    events = [e for line in out.splitlines() for e in json.loads(line)["events"]]
    stored = [e for e in events if e["type"] == "BlockStored" and e["token_ids"][0] == 0]
    removed = {h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
    return bool(stored) and set(stored[0]["block_hashes"]) <= removed


class TestEventsCli(unittest.TestCase):
    def tail(self, encoding, done, *flags):
        """The tail's output: probes first, then the test's events. The tail
        runs until done(output so far) says the test's events are all there,
        then stops on SIGTERM. (It used to end by --wait, 2 s after the last
        message: a test descheduled for 2 s between its probes and its events
        lost the events, and the test failed now and then under load.)"""
        tmp = tempfile.mkdtemp(prefix="kvs-events-cli-")
        pub = "ipc://%s/pub" % tmp
        d = Daemon(blocks=256, extra=["--kv-events", pub, "--kv-events-model", "m",
                                      "--kv-events-pod", "p", "--kv-events-encoding", encoding])
        cli = None
        try:
            c = kvshare.Client(d.socket, timeout_ms=10000)
            # The start's AllBlocksCleared is out before the tail starts (the
            # counter moves only after a send), so the tail never sees it.
            deadline = time.monotonic() + 10
            while c.stats()["kv_events_published"] < 1:
                self.assertLess(time.monotonic(), deadline, "no AllBlocksCleared at start")
                time.sleep(0.01)
            cli = subprocess.Popen([CLI, "events", "--endpoint", pub] + list(flags),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out = bytearray()

            def more(timeout):
                """Appends what the tail printed within timeout s; False if nothing."""
                if not select.select([cli.stdout], [], [], timeout)[0]:
                    return False
                chunk = os.read(cli.stdout.fileno(), 65536)
                self.assertTrue(chunk, "the tail exited early")
                out.extend(chunk)
                return True

            # A publisher drops what it sends before the tail's subscription
            # reaches it, and when that is depends on when the tail gets to
            # run. So probe: commit one pinned block at a time until the tail
            # prints something. Pinned probes are never evicted below; the
            # limit on their number is a deadline (40 s), not a pace.
            probes = 0
            while not more(0.2):
                self.assertIsNone(cli.poll(), "the tail exited early")
                self.assertLess(probes, 200, "the tail never printed a probe")
                ids = c.alloc(1)
                c.commit([PROBE + probes * BT + k for k in range(BT)], ids)
                probes += 1
            # Then: BlockStored, and three BlockRemoved by eviction (in one to
            # three messages).
            ids = c.alloc(3)
            c.commit(list(range(3 * BT)), ids)
            c.release(ids)
            ids = c.alloc(256 - probes)  # evicts the three, not the pinned probes
            c.release(ids)
            # Every line out; a tail that never gets there fails at the
            # deadline, it is not waited for.
            deadline = time.monotonic() + 60
            while not (out.endswith(b"\n") and done(out.decode())):
                self.assertLess(time.monotonic(), deadline,
                                "the tail printed no more of the test's events: %r" % bytes(out))
                more(1)
            cli.send_signal(signal.SIGTERM)
            rest, err = cli.communicate(timeout=30)
            out.extend(rest)
            self.assertEqual(cli.returncode, 0, err)
            self.assertEqual(err, b"")
            c.close()
            return out.decode()
        finally:
            if cli and cli.poll() is None:
                cli.kill()
                cli.wait()
            self.assertEqual(d.stop(), 0)

    def test_text(self):
        for encoding in ("map", "array"):
            lines = self.tail(encoding, text_done).splitlines()
            first = next(i for i, line in enumerate(lines) if "BlockStored 3 blocks" in line)
            self.assertGreater(first, 0, lines)
            for line in lines[:first]:
                self.assertRegex(line, r"^ +[0-9]+ kv@p@m BlockStored 1 block [0-9a-f]{16} "
                                 r"parent - tokens 4 block_size 4 medium CPU$")
            # A message's events share its seq; messages are numbered 1 apart.
            seqs = [int(line.split()[0]) for line in lines]
            self.assertTrue(all(b - a in (0, 1) for a, b in zip(seqs, seqs[1:])), lines)
            lines = lines[first:]
            self.assertEqual(len(lines), 4, lines)
            self.assertRegex(lines[0], r"^ +[0-9]+ kv@p@m BlockStored 3 blocks [0-9a-f]{16}\.\.\."
                             r"[0-9a-f]{16} parent - tokens 12 block_size 4 medium CPU$")
            for line in lines[1:]:
                self.assertRegex(line, r"^ +[0-9]+ kv@p@m BlockRemoved 1 block [0-9a-f]{16} "
                                 r"medium CPU$")

    def test_json(self):
        for encoding in ("map", "array"):
            msgs = [json.loads(line)
                    for line in self.tail(encoding, json_done, "--json").splitlines()]
            seqs = [m["seq"] for m in msgs]
            self.assertEqual(seqs, list(range(seqs[0], seqs[0] + len(seqs))))
            self.assertGreaterEqual(seqs[0], 1)  # the start's message came before
            # Probes may share a message with the test's first event (the
            # publisher batches what is queued): sort by event, not message.
            events = [e for m in msgs for e in m["events"]]
            probes = [e for e in events if e.get("token_ids", [0])[0] >= PROBE]
            self.assertGreater(len(probes), 0)
            self.assertEqual(events[:len(probes)], probes)
            self.assertTrue(all(e["type"] == "BlockStored" for e in probes))
            self.assertEqual(msgs[0]["topic"], "kv@p@m")
            self.assertTrue(all(m["data_parallel_rank"] is None for m in msgs))
            events = events[len(probes):]
            stored = events[0]
            self.assertEqual(stored["type"], "BlockStored")
            self.assertEqual(stored["token_ids"], list(range(3 * BT)))
            self.assertEqual(stored["block_size"], BT)
            self.assertIsNone(stored["parent_block_hash"])
            self.assertEqual(stored["medium"], "CPU")
            self.assertTrue(all(e["type"] == "BlockRemoved" for e in events[1:]))
            removed = {e["block_hashes"][0] for e in events[1:]}
            self.assertEqual(removed, set(stored["block_hashes"]))

    def test_usage(self):
        r = subprocess.run([CLI, "events", "--count", "0"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--count", r.stderr)
        r = subprocess.run([CLI, "events", "--wat", "5"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown or incomplete option '--wat'", r.stderr)
        r = subprocess.run([CLI, "events", "--endpoint", "tcp://127.0.0.1:1", "--wait", "200"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no message in 200 ms", r.stderr)
        r = subprocess.run([CLI, "events", "--endpoint", "bogus"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot connect to bogus", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
