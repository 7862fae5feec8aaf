# SPDX-License-Identifier: Apache-2.0
"""The test daemon for Python tests: a real kvshared on a socket in a new
temporary directory (under $TMPDIR), host backend, a small geometry, started
the way tests/support/launch.c starts it: READY on --ready-fd, within a
deadline, so that no test races the daemon's start or hangs on one that never
starts. Also the frame header of the wire protocol, for tests that read raw
bytes.

The daemon binary is the kvshared argument, else KVSHARED from the
environment; KVS_TEST_DAEMON_LOG sets its log level (default warn)."""
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import time

BT = 4                  # tokens per block of the test geometry
# The test geometry, as kvshared's flags name it; Daemon(geometry=...) changes
# any of it (tests of real tensors want a model-like shape).
GEOMETRY = {"layers": 2, "kv_heads": 2, "head_dim": 8, "dtype": "fp16", "block_tokens": BT}
READY_SECONDS = 30      # as LAUNCH_READY_MS in launch.h
FRAME_HEADER_BYTES = 4  # as common/frame_header.h
SOCKET_PATH_MAX = 108   # as common/socket_path.h, NUL included


def frame(body):
    """body (bytes) as one frame: a 4-byte little-endian length, then body."""
    return len(body).to_bytes(FRAME_HEADER_BYTES, "little") + body


def frame_len(header):
    """The body length in a frame header (its first 4 bytes)."""
    return int.from_bytes(header[:FRAME_HEADER_BYTES], "little")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(fd, seconds):
    """True once b"READY\\n" came on fd within seconds; False if the pipe
    closed first, something else came, or time ran out."""
    deadline = time.monotonic() + seconds
    got = b""
    while len(got) < 6:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return False
        chunk = os.read(fd, 6 - len(got))
        if not chunk:
            return False
        got += chunk
    return got == b"READY\n"


class Daemon:
    """kvshared with `blocks` blocks of the test geometry (or GEOMETRY updated
    by `geometry`) on `backend`, an optional config file (its text), extra
    flags, and, with metrics, a free TCP port for --metrics-listen. Its
    stderr is kept (log()). With `dir`, the daemon lives in that directory
    (made if missing) rather than a new one: a daemon started again with the
    same dir listens on the same socket, as a restarted service does."""

    def __init__(self, blocks=64, config=None, extra=(), metrics=False,
                 ready_seconds=READY_SECONDS, kvshared=None, backend="host", geometry=None,
                 dir=None):
        geo = dict(GEOMETRY, **(geometry or {}))
        unknown = set(geo) - set(GEOMETRY)
        if unknown:
            raise ValueError("unknown geometry keys %s (known: %s)"
                             % (sorted(unknown), ", ".join(GEOMETRY)))
        if dir is None:
            self.dir = tempfile.mkdtemp(prefix="kvs-py-")
        else:
            os.makedirs(dir, exist_ok=True)
            self.dir = dir
        self.socket = os.path.join(self.dir, "kvshared.sock")
        if len(self.socket) >= SOCKET_PATH_MAX:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError("%s is too long for a socket path: set TMPDIR shorter"
                               % self.socket)
        self.port = free_port() if metrics else None
        self.config = None
        args = [kvshared or os.environ["KVSHARED"], "--socket", self.socket,
                "--backend", backend, "--pool-blocks", str(blocks),
                "--log-level", os.environ.get("KVS_TEST_DAEMON_LOG", "warn")]
        for key, value in geo.items():
            args += ["--" + key.replace("_", "-"), str(value)]
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
        try:
            ready = wait_ready(r, ready_seconds)
        finally:
            os.close(r)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            log = self.log()
            self.stderr.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError("kvshared did not start within %d s: %s" % (ready_seconds, log))

    def log(self):
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()

    def url(self, path="/metrics"):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends sig, waits (SIGKILL after timeout seconds); returns the exit
        status (negative: the signal that ended it)."""
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc
