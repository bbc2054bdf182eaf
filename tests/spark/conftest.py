"""One local[2] Spark session for the whole test run, and helpers to read topics with it.

The session starts once (10-15 s here) and every Spark test shares it; Python workers run on
this interpreter, which has the package installed, so executors import ``datasource``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs.session import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session("logstore-tests")
    yield session
    session.stop()
