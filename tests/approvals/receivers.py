"""Raw HTTP receivers on loopback that misbehave slowly: they dribble an answer a byte at a
time or flood one, for the tests of the outbound client's deadline and size cap."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

# How long a receiver keeps dribbling at most: far longer than any deadline here.
DRIBBLE_FOR = 30.0


class Receiver:
    """A raw loopback server: reads a request, then answers with ``answer(conn)``, which
    may take its time; stops by itself after ``DRIBBLE_FOR`` seconds."""

    def __init__(self, answer: Callable[[socket.socket, threading.Event], None]) -> None:
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            thread = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            try:
                conn.recv(65536)
                self.answer(conn, self.stop)
            except OSError:
                pass  # the client gave up: what the tests want

    def close(self) -> None:
        self.stop.set()
        self._accepting.join()
        for thread in self._threads:
            thread.join(timeout=DRIBBLE_FOR)
        self.sock.close()


def dribble(prefix: bytes, byte: bytes = b"a", every: float = 0.2) -> Any:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(prefix)
        ends = time.monotonic() + DRIBBLE_FOR
        while not stop.wait(every) and time.monotonic() < ends:
            conn.sendall(byte)

    return answer


def flood(head: bytes, total: int) -> Any:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        chunk = b"x" * 65536
        for _ in range(total // len(chunk)):
            if stop.is_set():
                return
            conn.sendall(chunk)

    return answer
