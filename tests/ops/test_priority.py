# SPDX-License-Identifier: Apache-2.0
"""loop_rt_priority: the loop thread under SCHED_RR at that priority while
the tiers' threads stay at normal priority, niced by tier_copy_nice, and the
daemon serves through tier copies; refused with a clear error where the
process may not use SCHED_RR."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

from ops_daemon import BT, Daemon, kvshare

RESET_ON_FORK = getattr(os, "SCHED_RESET_ON_FORK", 0x40000000)


def policy(tid):
    return os.sched_getscheduler(tid) & ~RESET_ON_FORK


def nice_of(pid, tid):
    with open("/proc/%d/task/%d/stat" % (pid, tid)) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of stat; the first two are cut off


def may_use_rr():
    """None when this process may set SCHED_RR, else why not."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except PermissionError as e:
        return "this process may not use SCHED_RR (%s)" % e
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    return None


class LoopPriorityTest(unittest.TestCase):
    def test_loop_thread_real_time_tier_threads_normal(self):
        why = may_use_rr()
        if why:
            print("skipped: %s" % why, file=sys.stderr)
            self.skipTest(why)
        d = Daemon(blocks=16, extra=["--loop-rt-priority", "3", "--host-tier", "32KiB",
                                     "--tier-copy-nice", "7"], metrics=False)
        try:
            pid = d.proc.pid
            self.assertEqual(policy(pid), os.SCHED_RR)
            self.assertTrue(os.sched_getscheduler(pid) & RESET_ON_FORK)
            self.assertEqual(os.sched_getparam(pid).sched_priority, 3)
            with kvshare.Client(socket_path=d.socket) as c:
                # Four times the pool: blocks go down to the host tier and
                # come back, through its copy threads.
                prompts = [[p * 1000 + i for i in range(4 * BT)] for p in range(16)]
                for toks in prompts:
                    ids = c.alloc(4)
                    c.commit(toks, ids)
                    c.release(ids)
                got = c.lookup(prompts[0])  # pinned: promoted from the host tier
                self.assertEqual(len(got), 4, "the first prompt came back from the host tier")
                c.release(got)
                st = c.stats()
                self.assertGreater(st["tier_promotions"], 0)
            others = [int(t) for t in os.listdir("/proc/%d/task" % pid) if int(t) != pid]
            self.assertGreaterEqual(len(others), 4, "the host tier's copy threads")
            base = nice_of(pid, pid)
            for tid in others:
                self.assertEqual(policy(tid), os.SCHED_OTHER, "thread %d" % tid)
                self.assertEqual(nice_of(pid, tid), min(base + 7, 19), "thread %d" % tid)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_refused_without_the_right(self):
        """Without CAP_SYS_NICE and with an RLIMIT_RTPRIO of 0 kvshared
        stops at start, naming the setting, the error and what it needs."""
        tmp = tempfile.mkdtemp(prefix="kvs-rt-")
        cmd = [os.environ["KVSHARED"], "--socket", os.path.join(tmp, "k.sock"), "--backend",
               "host", "--pool-blocks", "4", "--layers", "2", "--kv-heads", "2", "--head-dim",
               "32", "--loop-rt-priority", "3"]
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                print("skipped: running as root and setpriv is missing", file=sys.stderr)
                self.skipTest("setpriv is missing")
            os.chown(tmp, 65534, 65534)  # the socket's directory, the daemon's user's
            cmd = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                   "--inh-caps=-all", "--bounding-set=-all"] + cmd

        def no_rtprio():
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))

        try:
            p = subprocess.run(cmd, preexec_fn=no_rtprio, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("loop_rt_priority 3: Operation not permitted", p.stderr)
            self.assertIn("CAP_SYS_NICE", p.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "k.sock")), "it never listened")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
