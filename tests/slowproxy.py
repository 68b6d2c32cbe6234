"""A TCP proxy in front of the S3 server that delays each PUT (a busy store's tail latency) or drops
every connection (a partition): real network behaviour for the lock tests, no mock of the client."""

from __future__ import annotations

import random
import socket
import threading
import time


class SlowProxy:
    """Listen on 127.0.0.1:``port``; forward to ``upstream``; hold each chunk that starts a PUT for a
    random ``delay`` (seconds, low-high) before sending it on. ``blocked`` refuses and cuts all traffic."""

    def __init__(self, upstream: tuple[str, int], delay: tuple[float, float] = (0.0, 0.0), seed: int = 0) -> None:
        self.upstream, self.delay = upstream, delay
        self.blocked = False
        self.puts = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _wait(self) -> float:
        with self._lock:
            self.puts += 1
            return self._rng.uniform(*self.delay)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.blocked:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk or self.blocked:
                    break
                if requests and chunk.startswith(b"PUT "):
                    time.sleep(self._wait())
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def block(self) -> None:
        """Cut every open connection and refuse new ones until :meth:`unblock`."""
        self.blocked = True
        with self._lock:
            for s in self._open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()

    def unblock(self) -> None:
        self.blocked = False

    def close(self) -> None:
        self.block()
        self._server.close()
