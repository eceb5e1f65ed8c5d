"""A TCP relay on the loopback that keeps silent at first: a server that accepts connections but answers late.

A loaded Ray head's client server was seen to accept ``ray://`` connections and not answer Ray's ping within
Ray's 30 s (CI-23: "ray client connection timeout"). ``LateRelay`` stands in front of the real server: every
connection accepted in its first ``silent_s`` seconds after the first one arrived is held open, unread and
unanswered, then closed; later ones are relayed both ways.
"""

from __future__ import annotations

import socket
import threading
import time


class LateRelay:
    """Relay ``127.0.0.1:port`` to ``target`` (HOST, PORT), silent for ``silent_s`` after the first connection."""

    def __init__(self, target: tuple[str, int], silent_s: float) -> None:
        self.target, self.silent_s = target, silent_s
        self.held = 0  # connections held silent, then closed
        self._first: float | None = None
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def __enter__(self) -> LateRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            now = time.monotonic()
            self._first = self._first if self._first is not None else now
            opens_at = self._first + self.silent_s
            if now < opens_at:
                self.held += 1
                threading.Thread(target=self._hold, args=(conn, opens_at), daemon=True).start()
            else:
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket, until: float) -> None:
        self._closed.wait(max(0.0, until - time.monotonic()))
        conn.close()

    def _relay(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
        _pipe(conn, upstream)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either side closes; then close both."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
