"""A real S3 endpoint for tests: moto's server on 127.0.0.1 (an ephemeral port), reached through
s3fs's real HTTP path, never through moto's in-process mocks.

``MotoS3.start()`` runs ``moto.server.ThreadedMotoServer``; ``stop()`` closes its listening
socket too (so clients are refused at once, as by a stopped store, rather than left hanging in
the backlog) and ``start()`` again brings it back on the same port with the same buckets and
objects (moto keeps them in this process). Credentials are dummy values in the environment,
set by the fixture (``credentials_env``): never in a config file. Keep objects small: moto moves
about 100-170 MB/s and re-reads whole objects to answer range reads.
"""

from __future__ import annotations

import uuid
from typing import Any

from moto.server import ThreadedMotoServer

CREDENTIALS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class MotoS3:
    """One moto S3 server on 127.0.0.1."""

    def __init__(self) -> None:
        self.port = 0
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
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
