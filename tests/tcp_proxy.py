"""A TCP proxy on 127.0.0.1 that a test can pause: the network fault between brokers and the
object store (moto's server) that stopping the server cannot give, a store that accepts a
request and then hangs.

``TcpProxy(target_port).start()`` listens on an ephemeral port and forwards every connection
to the target. ``pause()`` stops forwarding bytes in both directions (connections stay open,
so an upload in flight hangs until the client's own timeout); ``resume()`` lets them flow
again. Owns nothing else; must not look at or change the bytes.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()
        return self

    def pause(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with suppress(OSError):
            self._listener.close()
        with self._lock:
            for s in self._sockets:
                with suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(CHUNK):
                self._flowing.wait()
                if self._closed.is_set():
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
