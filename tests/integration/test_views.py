# SPDX-License-Identifier: Apache-2.0
"""kvshare top and kvshare tree as an operator sees them. Each runs in a real
terminal (tmux: start it, send keys, read the screen back) against a
kvshared that this test starts with a known workload, and the test checks
what a person would read: the hit rate shown equals Stats, the sparkline
follows the traffic, keys switch pages and quit, a resize redraws, a daemon
restart shows in the view and the view carries on; the top branch of the
tree is the hottest system prompt. Also --once and --json, which need no
terminal.

Run by ctest with KVSHARED, KVSHARE_CLI and KVSHARE_LIB in the environment;
exits 77 (skipped) without tmux."""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import kvsd  # noqa: E402
import kvshare  # noqa: E402

BT = kvsd.BT
SKIP = 77
CLI = os.environ.get("KVSHARE_CLI", "")
WAIT = 20.0  # seconds a screen may take to show something (sanitizer builds are slow)
FULL, LOWEST = "\u2588", "\u2581"  # the sparkline's 100 % and 0-12 % marks

# The workload: five system prompts of 4 blocks, each opening `weight`
# conversations of two turns; then one-off prompts without a system prompt,
# and one request in a second namespace.
WEIGHTS = [40, 25, 15, 8, 4]


def sys_prompt(k):
    return [1000 * (k + 1) + i for i in range(4 * BT)]


def request(c, ns, tokens):
    """What a worker does for one prompt: look up (pinned), allocate the
    rest, commit, release. Returns the canonical block ids."""
    n = len(tokens) // BT
    ids = c.lookup(tokens, ns=ns, pin=True)
    fresh = c.alloc(n - len(ids), ns=ns) if n > len(ids) else []
    canon = list(c.commit(tokens[:n * BT], list(ids) + list(fresh), ns=ns))
    c.release(canon)
    dup = [f for f, k in zip(fresh, canon[len(ids):]) if f != k]
    if dup:
        c.release(dup)
    return canon


def workload(c):
    """Returns the last block id of each system prompt, in WEIGHTS order."""
    last_ids = []
    for k, weight in enumerate(WEIGHTS):
        for u in range(weight):
            turn1 = sys_prompt(k) + [50000 + 1000 * k + 10 * u + i for i in range(2 * BT)]
            canon = request(c, "chat", turn1)
            if u == 0:
                last_ids.append(canon[3])
            request(c, "chat", turn1 + [70000 + 1000 * k + 10 * u + i for i in range(2 * BT)])
    for u in range(8):
        request(c, "chat", [90000 + 100 * u + i for i in range(3 * BT)])
    request(c, "batch", list(range(8 * BT)))
    return last_ids


def pct(part, whole):
    return "%.1f%%" % (100.0 * part / whole)


def since_start(stats):
    """The view's "since start" figure, computed from a Stats reply."""
    asked = sum(n["lookup_tokens"] for n in stats["namespaces"])
    hit = sum(n["hit_tokens"] for n in stats["namespaces"])
    return pct(hit, asked)


class Traffic:
    """Lookups in a thread, until stop(): all hits (a cached prompt) or all
    misses (a new prompt each time), in namespace ns."""

    def __init__(self, socket, ns, hits, tokens=None):
        self.stop_flag = threading.Event()
        self.error = None
        self.thread = threading.Thread(target=self.run, args=(socket, ns, hits, tokens),
                                       daemon=True)
        self.thread.start()

    def run(self, socket, ns, hits, tokens):
        try:
            with kvshare.Client(socket_path=socket, map_pool=False, timeout_ms=20000) as c:
                k = 0
                while not self.stop_flag.is_set():
                    k += 1
                    prompt = tokens if hits else [5000000 + 100 * k + i for i in range(4 * BT)]
                    c.lookup(prompt, ns=ns, pin=False)
                    time.sleep(0.005)
        except Exception as e:  # reported by stop()
            self.error = e

    def stop(self):
        self.stop_flag.set()
        self.thread.join(30)
        if self.error:
            raise self.error


class Pane:
    """One command in a tmux window of its own server (socket in dir): the
    screen as lines, keys, resizes. A shell runs the command and then
    prints its exit status on the screen and stays, so that the status can
    be read there (tmux's own pane_dead_status comes late when it comes)."""

    def __init__(self, dir, argv, cols=100, rows=30):
        self.sock = os.path.join(dir, "tmux.sock")
        conf = os.path.join(dir, "tmux.conf")
        with open(conf, "w") as f:
            # default-size too: the window must have its size before the
            # command's first output, not after (tmux applies -x/-y late).
            f.write("set -g status off\nset -g default-size %dx%d\n" % (cols, rows))
        cmd = " ".join(["env", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TERM=xterm-256color"]
                       + [shlex.quote(a) for a in argv])
        shell = "%s; echo \"[exit $?]\"; exec sleep 600" % cmd
        self.tmux("-f", conf, "new-session", "-d", "-s", "v", "-x", str(cols), "-y", str(rows),
                  "sh -c %s" % shlex.quote(shell))
        self.last = []

    def tmux(self, *args):
        r = subprocess.run(["tmux", "-u", "-S", self.sock] + list(args), capture_output=True,
                           text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError("tmux %s: %s" % (" ".join(args), r.stderr))
        return r.stdout

    def lines(self, history=False):
        """The screen's rows; with history, the rows scrolled off above it
        first."""
        out = self.tmux("capture-pane", "-p", "-t", "v", *(["-S", "-"] if history else []))
        self.last = out[:-1].split("\n") if out.endswith("\n") else out.split("\n")
        return self.last

    def screen(self):
        return "\n".join(self.lines())

    def wait(self, what, pred, timeout=WAIT):
        """Waits until pred(lines of the screen) is true; fails with the
        screen otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.lines()):
                return self.last
            time.sleep(0.1)
        raise AssertionError("the screen never showed %s:\n%s" % (what, "\n".join(self.last)))

    def wait_text(self, text, timeout=WAIT):
        return self.wait(repr(text), lambda ls: any(text in line for line in ls), timeout)

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "v", *keys)

    def resize(self, cols, rows):
        self.tmux("resize-window", "-t", "v", "-x", str(cols), "-y", str(rows))

    def wait_exit(self, timeout=WAIT):
        """The command's exit status, once the shell printed it."""
        lines = self.wait("the command's end", lambda ls: any(
            re.match(r"\[exit \d+\]$", line) for line in ls), timeout)
        return int([line for line in lines if re.match(r"\[exit \d+\]$", line)][0][6:-1])

    def close(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True, timeout=30)


def row_with(lines, text):
    for i, line in enumerate(lines):
        if text in line:
            return i
    raise AssertionError("no line with %r in:\n%s" % (text, "\n".join(lines)))


def cli(*args):
    return subprocess.run([CLI] + list(args) + ["--timeout", "20000"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, LANG="C.UTF-8"))


class ViewsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvs-views-")
        self.daemon = kvsd.Daemon(blocks=2048, dir=os.path.join(self.dir, "d"))
        self.client = kvshare.Client(socket_path=self.daemon.socket, map_pool=False,
                                     timeout_ms=20000)
        self.sys_last_ids = workload(self.client)
        self.panes = []

    def tearDown(self):
        for p in self.panes:
            p.close()
        self.client.close()
        if self.daemon:
            self.assertEqual(self.daemon.stop(), 0)
        shutil.rmtree(self.dir, ignore_errors=True)

    def pane(self, *args, cols=100, rows=30):
        d = tempfile.mkdtemp(dir=self.dir)
        p = Pane(d, [CLI] + list(args) + ["--socket", self.daemon.socket, "--timeout", "20000"],
                 cols, rows)
        self.panes.append(p)
        return p

    def test_top_header_sparkline_pages_resize_quit(self):
        stats = self.client.stats()
        p = self.pane("top", "--interval", "0.3")
        lines = p.wait_text("since start")
        # The figure a person reads first equals the one Stats gives.
        head = lines[row_with(lines, "since start")]
        self.assertIn(since_start(stats) + " since start", head)
        self.assertIn("[overview]", lines[0])
        self.assertIn("q quit", lines[-1])
        pool = lines[row_with(lines, "pool ")]
        used = stats["total_blocks"] - stats["free_blocks"]
        self.assertIn("%d/%d blocks: %d cached" % (used, stats["total_blocks"],
                                                  stats["cached_blocks"]), pool)
        self.assertIn(FULL, pool)  # the bar

        # Busiest first: only "batch" is looked up now.
        self.client.lookup(list(range(8 * BT)), ns="batch", pin=False)
        t = Traffic(self.daemon.socket, "batch", hits=True, tokens=list(range(8 * BT)))
        try:
            p.wait("every lookup a hit", lambda ls: any("hit rate  100.0% last" in x for x in ls))
            lines = p.wait("batch listed first", lambda ls: self.ns_order(ls)[:1] == ["batch"])
            spark = lines[row_with(lines, "hit rate, last") + 1]
            self.assertIn(FULL, spark)
        finally:
            t.stop()
        t = Traffic(self.daemon.socket, "chat", hits=False)
        try:
            p.wait("every lookup a miss", lambda ls: any("hit rate  0.0% last" in x for x in ls))
            lines = p.wait("chat listed first", lambda ls: self.ns_order(ls)[:1] == ["chat"])
            spark = lines[row_with(lines, "hit rate, last") + 1]
            # Oldest at the left: the hits, then the misses.
            self.assertIn(LOWEST, spark)
            self.assertLess(spark.index(FULL), spark.rindex(LOWEST))
        finally:
            t.stop()

        # The second page: every counter, then back with tab.
        p.keys("2")
        lines = p.wait_text("COUNTER (since start)")
        self.assertIn("[counters]", lines[0])
        self.assertIn("evictions", p.screen())
        p.keys("Tab")
        p.wait_text("since start")
        p.keys("h")
        p.wait_text("docs/OPERATING.md")
        p.keys("x")
        p.wait_text("since start")

        # Narrower and shorter: lines fit, the key bar is on the last row.
        p.resize(60, 16)
        lines = p.wait("the key bar on row 16",
                       lambda ls: len(ls) == 16 and "q quit" in ls[15] and "since start" in
                       "".join(ls))
        self.assertTrue(all(len(line) <= 60 for line in lines), lines)
        p.resize(120, 40)
        p.wait("the key bar on row 40", lambda ls: len(ls) == 40 and "q quit" in ls[39])

        p.keys("q")
        self.assertEqual(p.wait_exit(), 0)
        # The terminal is given back: the alternate screen is gone.
        self.assertNotIn("q quit", p.screen())

    def test_top_80x24_reflows(self):
        """At 80 x 24 every line fits, and what does not fit goes whole to
        a second line or is left out: no figure is cut in the middle."""
        stats = self.client.stats()
        p = self.pane("top", "--interval", "0.3", cols=80, rows=24)
        lines = p.wait("the overview at 80x24", lambda ls: len(ls) == 24 and "q quit" in ls[23]
                       and any(x.startswith("chat ") for x in ls))
        self.assertTrue(all(len(line) <= 80 for line in lines), "\n".join(lines))
        text = "\n".join(lines)
        self.assertIn(since_start(stats) + " since start", text)
        # The rates: all five, each whole, the last ones on a second line.
        for label in ("lookups ", "prefill saved ", "evictions ", "requests ", "errors "):
            self.assertRegex(text, re.escape(label.strip()) + r" +[0-9.]+[kM]?(/s| tokens/s)")
        # The title: the page's name and the clock, never a cut word.
        self.assertIn("[overview]", lines[0])
        self.assertRegex(lines[0], r"\d\d:\d\d:\d\d *$")
        # The pool's figures, each whole, across the lines they take.
        used = stats["total_blocks"] - stats["free_blocks"]
        pool = row_with(lines, "pool ")
        words = " ".join(lines[pool:pool + 2]).split()
        self.assertIn("%d/%d" % (used, stats["total_blocks"]), words)
        self.assertIn("%d" % stats["cached_blocks"], words)
        self.assertIn("pinned", words)
        # The namespace table: the columns that fit, their headers whole;
        # the ones that do not are left out, not cut.
        h = row_with(lines, "NAMESPACE")
        head = lines[h].split()
        self.assertEqual(head[:5], ["NAMESPACE", "LOOKUP/s", "HIT%", "ALL%", "HELD"])
        self.assertNotIn("EVICTED", lines[h])
        chat = [x for x in lines[h + 1:] if x.startswith("chat ")][0].split()
        self.assertEqual(len(chat), len(head), lines[h:])
        p.keys("q")
        self.assertEqual(p.wait_exit(), 0)

    def test_top_daemon_restart(self):
        p = self.pane("top", "--interval", "0.3")
        p.wait_text("since start")
        sock = self.daemon.socket
        self.assertEqual(self.daemon.stop(), 0)
        self.daemon = None
        lines = p.wait_text("kvshared not answering")
        # Its last figures stay on screen, the interval is marked down.
        self.assertIn("since start", "\n".join(lines))
        p.wait("an x in the sparkline",
               lambda ls: "x" in ls[row_with(ls, "hit rate, last") + 1])
        self.daemon = kvsd.Daemon(blocks=2048, dir=os.path.join(self.dir, "d"))
        self.assertEqual(self.daemon.socket, sock)
        lines = p.wait_text("kvshared restarted")
        self.assertNotIn("not answering", "\n".join(lines))
        # The new daemon's figures: a lookup half of which hits.
        with kvshare.Client(socket_path=sock, map_pool=False, timeout_ms=20000) as c:
            request(c, "fresh", list(range(4 * BT)))
            c.lookup(list(range(2 * BT)) + [7] * (2 * BT), ns="fresh", pin=False)
            expect = since_start(c.stats())
        self.assertEqual(expect, "25.0%")  # 8 of 16 + 16 tokens
        p.wait_text(expect + " since start")
        p.keys("q")
        self.assertEqual(p.wait_exit(), 0)

    def test_top_once_and_json(self):
        stats = self.client.stats()
        r = cli("top", "--once", "--interval", "0.2", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(since_start(stats) + " since start", r.stdout)
        self.assertNotIn("\033", r.stdout)
        order = [line.split()[0] for line in r.stdout.split("\n")
                 if line.startswith(("chat ", "batch "))]
        self.assertEqual(order, ["chat", "batch"])  # by traffic since start
        r = cli("top", "--once", "--json", "--interval", "0.2", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        objs = [json.loads(line) for line in r.stdout.strip().split("\n")]
        self.assertEqual(len(objs), 1)
        o = objs[0]
        self.assertAlmostEqual(o["hit_rate_since_start"] * 100,
                               float(since_start(stats)[:-1]), delta=0.05)
        self.assertIsNone(o["hit_rate"])  # no lookup in the interval
        self.assertEqual(o["lookups_per_s"], 0)
        self.assertEqual(o["pool"]["cached"], stats["cached_blocks"])
        self.assertEqual([n["name"] for n in o["namespaces"]], ["chat", "batch"])
        r = cli("top", "--json", "--count", "3", "--interval", "0.1", "--socket",
                self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        objs = [json.loads(line) for line in r.stdout.strip().split("\n")]
        self.assertEqual(len(objs), 3)
        self.assertIsNone(objs[0]["interval_s"])  # one sample: no rates yet
        self.assertGreater(objs[2]["interval_s"], 0)

    def test_tree_in_a_terminal(self):
        rows = self.client.tree(ns="chat", max_rows=1000)
        stats = {n["name"]: n for n in self.client.stats()["namespaces"]}
        p = self.pane("tree", "--ns", "chat", cols=110, rows=40)
        self.assertEqual(p.wait_exit(), 0)
        lines = p.lines(history=True)
        head = row_with(lines, "PREFIX (tokens)")
        self.assertTrue(lines[0].startswith("namespace chat: %d lookups" %
                                            stats["chat"]["lookups"]), lines)
        # The top branch is the hottest system prompt, then the others by
        # weight; each folds its conversations (under 1 % each) below it.
        tops = [line for line in lines[head + 1:] if "\u251c\u2500 " in line[40:43]
                or "\u2514\u2500 " in line[40:43]]
        by_id = {r["last_block_id"]: r for r in rows}
        for k, last_id in enumerate(self.sys_last_ids):
            r = by_id[last_id]
            self.assertFalse(r["has_parent"])
            cols = tops[k].split()
            self.assertEqual(int(cols[0]), r["hits"], tops[k])
            self.assertEqual(cols[1], pct(r["hits"], stats["chat"]["lookups"]))
            self.assertEqual(int(cols[2]), r["blocks"])
            self.assertEqual(cols[-1], str(4 * BT))
        first = lines[head + 1]
        self.assertTrue(first.endswith("\u251c\u2500 16"), first)
        below = lines[head + 2]
        self.assertIn("\u2502  \u2514\u2500 %d more prefixes below 1.0%%" % WEIGHTS[0], below)

    def test_tree_json_nests(self):
        r = cli("tree", "--json", "--socket", self.daemon.socket)
        self.assertEqual(r.returncode, 0, r.stderr)
        t = json.loads(r.stdout)
        ns = {n["name"]: n for n in t["namespaces"]}
        chat = ns["chat"]
        prefixes = chat["prefixes"]
        self.assertEqual([x["last_block_id"] for x in prefixes[:5]], self.sys_last_ids)
        top = prefixes[0]
        # Every conversation of the hottest system prompt, below it.
        self.assertEqual(len(top["children"]), WEIGHTS[0])
        self.assertTrue(all(ch["tokens"] == top["tokens"] + 4 * BT for ch in top["children"]))
        self.assertEqual(top["blocks"], 4 + sum(ch["blocks"] for ch in top["children"]))
        self.assertAlmostEqual(top["share"], top["hits"] / chat["lookups"], places=3)
        # The one-off prompts hang from the root, with nothing below.
        self.assertEqual(sum(1 for x in prefixes if x["tokens"] == 3 * BT), 8)
        # --min-share folds what is under it into one "more" entry.
        r = cli("tree", "--json", "--min-share", "10", "--ns", "chat", "--socket",
                self.daemon.socket)
        t = json.loads(r.stdout)
        prefixes = t["namespaces"][0]["prefixes"]
        self.assertEqual([x.get("last_block_id") for x in prefixes[:3]], self.sys_last_ids[:3])
        more = prefixes[-1]
        self.assertEqual(more["more"], 2 + 8)
        self.assertEqual(prefixes[0]["children"], [{"more": WEIGHTS[0],
                                                    "blocks": 4 * WEIGHTS[0],
                                                    "hits": WEIGHTS[0], "tier2_blocks": 0,
                                                    "pins": 0}])

    @staticmethod
    def ns_order(lines):
        """The namespaces of the view's table, top to bottom."""
        try:
            h = row_with(lines, "NAMESPACE")
        except AssertionError:
            return []
        out = []
        for line in lines[h + 1:]:
            if not line.strip() or line.startswith(" q quit"):
                break
            out.append(line.split()[0])
        return out


if __name__ == "__main__":
    if not shutil.which("tmux"):
        print("skipped: tmux not installed (Debian: tmux; tools/install-deps.sh)")
        sys.exit(SKIP)
    unittest.main(verbosity=2)
