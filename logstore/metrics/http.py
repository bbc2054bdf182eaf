"""The Prometheus endpoint: a small threaded HTTP server for one registry.

Owns: listening on ``host:port`` (a port already taken is a ``ConfigError`` naming the config
key and the port), answering ``GET /metrics`` (and ``/``) with the registry in Prometheus's
text format as prometheus_client writes it, and 404 for any other path. Scrapes share their
work: a scrape waits for a rendering that starts after it arrived (so it never sees figures
older than itself), concurrent scrapes share that one rendering, and renderings start at most
every ``min_interval_s``; however many scrapers there are, the broker spends at most one
rendering's CPU per interval on them. Must not: know what the registry holds.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from logstore.errors import ConfigError

log = logging.getLogger(__name__)

MIN_RENDER_INTERVAL_S = 0.25
METRICS_PATHS = ("/metrics", "/")
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True  # as HTTPServer: a port with a live listener still fails


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None  # scrapes every few seconds would flood the broker's log


class Renderer:
    """Renders ``registry`` for scrapes: fresh for each, shared among concurrent ones."""

    def __init__(self, registry: CollectorRegistry,
                 min_interval_s: float = MIN_RENDER_INTERVAL_S) -> None:
        self._registry = registry
        self._min_interval_s = min_interval_s
        self._cond = threading.Condition()
        self._started = 0  # generation of the latest rendering begun
        self._finished = 0  # ... and finished
        self._last_start = float("-inf")
        self._output = b""
        self.renderings = 0
        self.waiting = 0  # scrapes waiting for a rendering (tests wait on it)

    def render(self) -> bytes:
        with self._cond:
            self.waiting += 1
            try:
                return self._await(self._started + 1)  # one begun after this call
            finally:
                self.waiting -= 1

    def _await(self, target: int) -> bytes:
        """With the lock held: the output of rendering ``target``, rendering it here if
        nobody else does."""
        while self._finished < target:
            if self._started == self._finished:  # nobody renders: this call does
                delay = self._last_start + self._min_interval_s - time.monotonic()
                if delay <= 0:
                    self._started = target
                    self._last_start = time.monotonic()
                    return self._render(target)
                self._cond.wait(delay)
            else:
                self._cond.wait()
        return self._output

    def _render(self, generation: int) -> bytes:
        """Render with the lock released (other scrapes wait on it meanwhile); the lock is
        held again on return, as the caller expects."""
        output = None
        self._cond.release()
        try:
            output = generate_latest(self._registry)
            return output
        finally:
            self._cond.acquire()
            if output is not None:
                self._output = output
            self._finished = generation
            self.renderings += 1
            self._cond.notify_all()


class MetricsServer:
    """Serves a registry on ``listener`` ("host:port"; port 0 picks one) once started."""

    def __init__(self, listener: str, registry: CollectorRegistry,
                 key: str = "metrics_listener",
                 min_interval_s: float = MIN_RENDER_INTERVAL_S) -> None:
        host, _, port = listener.rpartition(":")
        self._host, self._port = host, int(port)
        self._listener = listener
        self._key = key
        self.renderer = Renderer(registry, min_interval_s)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "the metrics server is not started"
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    def start(self) -> None:
        try:
            server = make_server(self._host, self._port, self._app, _Server, _QuietHandler)
        except (OSError, socket.gaierror) as e:
            raise ConfigError(f"{self._key} = {self._listener!r}: cannot listen on port "
                              f"{self._port}: {e.strerror or e}") from None
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-http",
                                        daemon=True)
        self._thread.start()
        log.info("metrics on http://%s/metrics", self.address)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", "/"), environ.get("REQUEST_METHOD", "GET")
        if path not in METRICS_PATHS:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{path} not found; metrics are at /metrics\n".encode()]
        if method not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        try:
            body = self.renderer.render()
        except Exception:  # boundary: a failed scrape is answered, the server goes on
            log.exception("rendering the metrics failed")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"rendering the metrics failed; see the log\n"]
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                  ("Content-Length", str(len(body)))])
        return [body if method == "GET" else b""]
