"""A real kvshared for the operations tests: small host pool, optional config
file and extra flags, a free TCP port for --metrics-listen, READY on a pipe."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
import kvshare  # noqa: E402,F401

BT = 4  # tokens per block


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(self, blocks=64, config=None, extra=(), metrics=True):
        self.dir = tempfile.mkdtemp(prefix="kvs-ops-")
        self.socket = os.path.join(self.dir, "kvshared.sock")
        self.port = free_port() if metrics else None
        self.config = None
        args = [os.environ["KVSHARED"], "--socket", self.socket, "--backend", "host",
                "--layers", "2", "--kv-heads", "2", "--head-dim", "8", "--dtype", "fp16",
                "--block-tokens", str(BT), "--pool-blocks", str(blocks),
                "--log-level", os.environ.get("KVS_TEST_DAEMON_LOG", "warn")]
        if config is not None:
            self.config = os.path.join(self.dir, "kvshared.conf")
            with open(self.config, "w") as f:
                f.write(config)
            args += ["--config", self.config]
        if metrics:
            args += ["--metrics-listen", "127.0.0.1:%d" % self.port]
        r, w = os.pipe()
        self.stderr = open(os.path.join(self.dir, "stderr"), "w+")
        self.proc = subprocess.Popen(args + ["--ready-fd", str(w)] + list(extra),
                                     pass_fds=(w,), stderr=self.stderr)
        os.close(w)
        with os.fdopen(r, "rb") as ready:
            line = ready.readline()
        if line != b"READY\n":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("kvshared did not start: " + self.log())

    def log(self):
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()

    def url(self, path="/metrics"):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def scrape(self):
        with urllib.request.urlopen(self.url(), timeout=10) as r:
            return r.read().decode()

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=timeout)
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


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
