# SPDX-License-Identifier: Apache-2.0
"""A Unix-socket proxy that delays kvshared's replies: the "slow" case of
bench_engines.py step.

    slow_proxy.py UPSTREAM PATH DELAY_MS

Listens on PATH; each connection gets one of its own to UPSTREAM (a
kvshared socket). Requests pass at once; each piece of a reply reaches
the client DELAY_MS after kvshared sent it. Runs until killed.
"""
import os
import queue
import socket
import sys
import threading
import time


class SlowProxy:
    """A Unix-socket proxy between the plug-ins and kvshared that hands each
    piece of a reply to the client delay seconds after kvshared sent it
    (requests pass at once). The file descriptors kvshared attaches to a
    reply (the pool's, in Hello: SCM_RIGHTS) go with the bytes they came
    with."""

    def __init__(self, upstream, path, delay):
        self.upstream, self.path, self.delay = upstream, path, delay
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            daemon = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                daemon.connect(self.upstream)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, daemon, 0.0), daemon=True).start()
            threading.Thread(target=self._delayed, args=(daemon, client), daemon=True).start()

    @staticmethod
    def _pump(src, dst, _delay):
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(src, 1 << 16, 16)
                if not data:
                    break
                socket.send_fds(dst, [data], fds) if fds else dst.sendall(data)
                for fd in fds:
                    os.close(fd)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _delayed(self, src, dst):
        """Reads kvshared's replies as they come; a second thread sends each
        piece at its arrival time + delay, so that pieces sent together are
        delayed together (each reply delay later than it was sent)."""
        pieces = queue.Queue()

        def send():
            while True:
                item = pieces.get()
                if item is None:
                    break
                t, data, fds = item
                wait = t + self.delay - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    socket.send_fds(dst, [data], fds) if fds else dst.sendall(data)
                except OSError:
                    pass
                for fd in fds:
                    os.close(fd)
            try:
                dst.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            while True:
                data, fds, _, _ = socket.recv_fds(src, 1 << 16, 16)
                if not data:
                    break
                pieces.put((time.monotonic(), data, fds))
        except OSError:
            pass
        pieces.put(None)

    def close(self):
        self.listener.close()


def main():
    upstream, path, delay_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    SlowProxy(upstream, path, delay_ms / 1000.0)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
