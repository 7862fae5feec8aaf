# SPDX-License-Identifier: Apache-2.0
"""The Prometheus rules in packaging/prometheus/: promtool checks them and runs
their unit tests (tests/ops/prometheus_rules_test.yml: each alert fires on one
synthetic series and stays quiet on another), and every kvshare_ metric they
name is one a real kvshared exports. promtool comes with Debian's prometheus
package (tools/install-deps.sh installs it): without it this test fails."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from ops_daemon import Daemon, metric, parse_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "..", "packaging", "prometheus", "kvshare-rules.yml")
RULES_TEST = os.path.join(HERE, "prometheus_rules_test.yml")

CONFIG = """[namespace chat]
reserve = 8
hit_rate_target = 0.5
tier = interactive

[namespace long-context]
quota = 32
tier = batch

[namespace scratch]
"""


def promtool():
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        raise AssertionError("promtool not found: install Debian's prometheus package "
                             "(tools/install-deps.sh does), or set PROMTOOL")
    return path


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def families(text):
    """Metric family names of an exposition, from its # TYPE lines."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


class RulesTest(unittest.TestCase):
    def test_promtool_check_rules(self):
        r = run(promtool(), "check", "rules", RULES)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS: 15 rules found", r.stdout)

    def test_promtool_unit_tests(self):
        r = run(promtool(), "test", "rules", RULES_TEST)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout)

    def test_every_alert_has_a_case_and_a_runbook_section(self):
        with open(RULES) as f:
            alerts = re.findall(r"^\s+- alert: (\w+)$", f.read(), re.M)
        with open(RULES_TEST) as f:
            tests = f.read()
        with open(os.path.join(HERE, "..", "..", "docs", "OPERATING.md")) as f:
            doc = f.read()
        self.assertEqual(len(alerts), 10)
        for a in alerts:
            # at least one case where it fires and one where it does not
            self.assertRegex(tests, r"alertname: %s\n\s+exp_alerts: \[\]" % a)
            self.assertRegex(tests, r"alertname: %s\n\s+exp_alerts:\n\s+- exp_labels" % a)
            self.assertTrue("### %s\n" % a in doc, "docs/OPERATING.md has no ### %s" % a)

    def test_rules_name_only_exported_metrics(self):
        with open(RULES) as f:
            named = set(re.findall(r"\b(kvshare_[a-z_]+)\b", f.read()))
        named -= {"kvshare_prefix_cache_hit_rate", "kvshare_prefix_cache_hits",
                  "kvshare_pool_usage"}  # recorded names
        d = Daemon(blocks=64, config=CONFIG)
        try:
            text = d.scrape()
            missing = named - families(text)
            self.assertFalse(missing, "the rules name metrics /metrics does not export")
            m = parse_metrics(text)
            self.assertEqual(metric(m, "kvshare_namespace_hit_rate_target", namespace="chat"), 0.5)
            self.assertEqual(metric(m, "kvshare_namespace_tier", namespace="chat",
                                    tier="interactive"), 1)
            self.assertEqual(metric(m, "kvshare_namespace_tier", namespace="long-context",
                                    tier="batch"), 1)
            # only namespaces whose section sets the key
            self.assertNotIn('kvshare_namespace_hit_rate_target{namespace="long-context"}', text)
            self.assertNotIn('namespace="scratch"', text.split("kvshare_namespace_tier")[1]
                             .split("# HELP")[0])
            # SIGHUP applies new targets and tiers
            with open(d.config, "w") as f:
                f.write(CONFIG.replace("hit_rate_target = 0.5", "hit_rate_target = 0.8")
                        .replace("tier = batch", "tier = offline"))
            d.proc.send_signal(signal.SIGHUP)
            for _ in range(100):
                m = parse_metrics(d.scrape())
                if metric(m, "kvshare_namespace_hit_rate_target", namespace="chat") == 0.8:
                    break
                time.sleep(0.05)
            self.assertEqual(metric(m, "kvshare_namespace_hit_rate_target", namespace="chat"), 0.8)
            self.assertEqual(metric(m, "kvshare_namespace_tier", namespace="long-context",
                                    tier="offline"), 1)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_bad_values_are_refused_with_their_line(self):
        with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
            f.write("[namespace chat]\nhit_rate_target = 1.5\ntier = two words\n")
        try:
            r = run(os.environ["KVSHARED"], "--check-config", f.name)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 1, out)
            self.assertIn(":2: hit_rate_target = '1.5': give a fraction in (0, 1]", out)
            self.assertIn(":3: tier = 'two words': 1 to 63 letters", out)
        finally:
            os.unlink(f.name)

if __name__ == "__main__":
    unittest.main(verbosity=2)
