# SPDX-License-Identifier: Apache-2.0
"""The operations tests' daemon (tests/support/kvsd.py, with a metrics
listener) and a reader for its Prometheus text."""
import os
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import kvshare  # noqa: E402,F401
import kvsd  # noqa: E402
from kvsd import BT  # noqa: E402,F401


class Daemon(kvsd.Daemon):
    """The test daemon with its metrics listener on by default."""

    def __init__(self, blocks=64, config=None, extra=(), metrics=True):
        super().__init__(blocks=blocks, config=config, extra=extra, metrics=metrics)

    def scrape(self):
        with urllib.request.urlopen(self.url(), timeout=10) as r:
            return r.read().decode()


def parse_metrics(text):
    """{(name, frozenset(labels.items())): value} of a text exposition."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        labels = {}
        if "{" in series:
            name, rest = series.split("{", 1)
            for part in rest.rstrip("}").split(","):
                if part:
                    k, v = part.split("=", 1)
                    labels[k] = v.strip('"')
        else:
            name = series
        out[(name, frozenset(labels.items()))] = float(value)
    return out


def metric(m, name, **labels):
    return m[(name, frozenset(labels.items()))]
