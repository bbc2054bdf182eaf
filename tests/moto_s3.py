"""A real S3 endpoint for tests: moto's server on 127.0.0.1 (an ephemeral port), reached through
s3fs's real HTTP path, never through moto's in-process mocks.

``MotoS3.start()`` runs ``moto.server.ThreadedMotoServer``; ``stop()`` closes its listening
socket too (so clients are refused at once, as by a stopped store, rather than left hanging in
the backlog) and ``start()`` again brings it back on the same port with the same buckets and
objects (moto keeps them in this process). Credentials are dummy values in the environment,
set by the fixture (``credentials_env``): never in a config file. Keep objects small: moto moves
about 100-170 MB/s and re-reads whole objects to answer range reads.

``bytes_sent`` counts the body bytes of every GET the server answered (a WSGI wrapper around
moto's app): what readers, wherever they run, fetched from object storage.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.threaded_moto_server import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
    make_server,
)
from moto.server import ThreadedMotoServer

CREDENTIALS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class _CountingServer(ThreadedMotoServer):  # type: ignore[misc]
    """moto's threaded server with its app wrapped to count the bytes of GET responses."""

    def __init__(self, counter: Callable[[int], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._counter = counter

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        counter = self._counter

        def counting(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            body = app(environ, start_response)
            if environ.get("REQUEST_METHOD") != "GET":
                return body  # type: ignore[no-any-return]
            chunks = list(body)
            counter(sum(len(c) for c in chunks))
            return chunks

        self._server = make_server(self._ip_address, self._port, counting, True,
                                   request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()


class MotoS3:
    """One moto S3 server on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadedMotoServer | None = None
        self._lock = threading.Lock()
        self.bytes_sent = 0

    def _count(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        server = _CountingServer(self._count, ip_address="127.0.0.1", port=self.port,
                                 verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            inner = server._server
            if inner is not None:
                inner.server_close()

    @property
    def running(self) -> bool:
        return self._server is not None

    def options(self) -> dict[str, Any]:
        """remote_storage_options for this endpoint: short timeouts and no botocore retries,
        so a stopped server fails a call in well under a second."""
        return {"endpoint_url": self.endpoint_url,
                "client_kwargs": {"region_name": "us-east-1"},
                "config_kwargs": {"connect_timeout": 2, "read_timeout": 10,
                                  "retries": {"max_attempts": 1}}}

    def create_bucket(self) -> str:
        import boto3  # moto's own dependency; tests only

        name = f"logstore-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint_url,
                     region_name="us-east-1").create_bucket(Bucket=name)
        return name


def serve_forever(ready: Any, counter: Any) -> None:
    """Run a counting moto server in this (child) process until it is terminated: its port
    goes into the queue ``ready``, the bytes of its GET responses into ``counter`` (a
    ``multiprocessing.Value('q')``). For benchmarks, so that the server does not share a GIL
    with the clients it is compared against."""
    import logging
    import os
    import time

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    for name, value in CREDENTIALS_ENV.items():
        os.environ.setdefault(name, value)

    def add(n: int) -> None:
        with counter.get_lock():
            counter.value += n

    server = _CountingServer(add, ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    ready.put(server.get_host_and_port()[1])
    while True:
        time.sleep(3600)
