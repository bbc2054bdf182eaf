"""One local[2] Spark session for the whole test run, and helpers to read topics with it.

The session starts once (10-15 s here) and every Spark test shares it; Python workers run on
this interpreter, which has the package installed, so executors import ``datasource``. They
also inherit the driver's environment as it is when the session starts, which is how they get
object-store credentials (the moto endpoint's dummy ``AWS_*`` values, set first).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from tests.moto_s3 import CREDENTIALS_ENV

    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        session = local_session("logstore-tests")
        yield session
        session.stop()
