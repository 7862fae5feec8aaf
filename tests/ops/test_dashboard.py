# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard (packaging/grafana/kvshare.json) queries only what
exists: every metric name in its panels' and variables' queries is a sample
a real kvshared exports (scraped with tier 2, tier 3 and a cluster tier
configured, and a namespace with a hit_rate_target and a tier, so that every
optional family is there), a recording rule of
packaging/prometheus/kvshare-rules.yml, or Prometheus's own `up`."""
import json
import os
import re
import shutil
import tempfile
import unittest

from ops_daemon import Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
DASHBOARD = os.path.join(ROOT, "packaging", "grafana", "kvshare.json")
RULES = os.path.join(ROOT, "packaging", "prometheus", "kvshare-rules.yml")

# PromQL words that are not series names (functions and aggregations are
# told apart by the "(" after them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
            "and", "or", "unless", "inf", "nan"}


def metric_names(expr):
    """Series names a PromQL expression (or a Grafana label_values query)
    reads."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\)\s*", expr)
    if m:  # Grafana's label_values(series, label): the series only
        expr = m.group(1)
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, which may hold anything
    e = re.sub(r"\{[^}]*\}", "", e)  # matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        if word.lower() in KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the e of 1e-3, a unit of a duration
        names.add(word)
    return names


def queries(dash):
    """Every expr of every panel (rows' panels included) and every
    variable's query."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query":
            out.append(("variable " + v["name"], q["query"] if isinstance(q, dict) else q))
    return out


class DashboardTest(unittest.TestCase):
    def test_extraction(self):
        self.assertEqual(metric_names(
            'histogram_quantile(0.99, sum by (le, rpc) (rate(a_bucket{x="b c",le=~"1e-3"}[5m])))'
            ' / on (job) group_left (tier) b:c:d offset 5m > 1e-3 and time() - c'),
            {"a_bucket", "b:c:d", "c"})
        self.assertEqual(metric_names('label_values(kvshare_info{job="kvshare"}, instance)'),
                         {"kvshare_info"})

    def test_every_query_names_what_exists(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        with open(RULES) as f:
            recorded = set(re.findall(r"^\s+- record: (\S+)$", f.read(), re.M))
        self.assertGreaterEqual(len(recorded), 5)
        disk = tempfile.mkdtemp(prefix="kvs-dash-")
        self.addCleanup(shutil.rmtree, disk, True)
        d = Daemon(blocks=64, config="[namespace chat]\nhit_rate_target = 0.5\n"
                   "tier = interactive\n", extra=(
            "--host-tier", "1M", "--disk-tier-path", os.path.join(disk, "tier3.dat"),
            "--disk-tier-bytes", "4M", "--cluster-seeds", "127.0.0.1:1"))
        try:
            text = d.scrape()
        finally:
            self.assertEqual(d.stop(), 0)
        exported = {re.split(r"[{ ]", line, 1)[0] for line in text.splitlines()
                    if line and not line.startswith("#")}
        # A family with no series yet (a cluster node not known yet) counts
        # by its TYPE line; a histogram's by its three series names.
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split()
                exported.add(family)
                if kind == "histogram":
                    exported |= {family + "_bucket", family + "_sum", family + "_count"}
        known = exported | recorded | {"up"}
        used = set()
        qs = queries(dash)
        self.assertGreaterEqual(len(qs), 20)
        for where, expr in qs:
            names = metric_names(expr)
            self.assertTrue(names, "%s: %s names no metric" % (where, expr))
            self.assertFalse(names - known, "%s: %s" % (where, expr))
            used |= names
        # Built on the recording rules: the hit rates, prefill saved, pool usage.
        self.assertTrue(recorded <= used, recorded - used)
        self.assertEqual(dash["uid"], "kvshare")
        ids = []

        def walk(panels):
            for p in panels:
                ids.append(p["id"])
                if p["type"] != "row":
                    self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
                walk(p.get("panels", []))

        walk(dash["panels"])
        self.assertEqual(len(ids), len(set(ids)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
