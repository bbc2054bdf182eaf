"""The broker process's malloc thresholds (``logstore.main.tune_malloc``, ``malloc_tuning``).

Goal: ``logstore broker start`` keeps freed buffers for reuse on glibc unless the operator chose
glibc's own variables or turned ``malloc_tuning`` off, and the key is checked like any other.
Method: ``tune_malloc`` in a child interpreter (the allocator is process-wide, so the test
process's own is left alone), with and without the variables; the config parser for the key.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from logstore.config import broker_config_from_dict
from logstore.errors import ConfigError
from logstore.main import MALLOC_ENV, tune_malloc

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def tuned_in_child(env: dict[str, str]) -> str:
    """What ``tune_malloc()`` returns in a fresh interpreter with ``env``."""
    return subprocess.run(
        [sys.executable, "-c", "from logstore.main import tune_malloc; print(tune_malloc())"],
        env=env, capture_output=True, text=True, check=True, timeout=60).stdout.strip()


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_broker_process_on_glibc_sets_its_thresholds(monkeypatch) -> None:
    for name in MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert tuned_in_child(dict(os.environ)) == "True"


@pytest.mark.parametrize("name", MALLOC_ENV)
def test_the_operators_own_malloc_variables_win(name: str) -> None:
    assert tune_malloc({name: "131072"}) is False


def test_malloc_tuning_is_a_checked_boolean_key() -> None:
    assert broker_config_from_dict({}).malloc_tuning is True
    assert broker_config_from_dict({"malloc_tuning": False}).malloc_tuning is False
    with pytest.raises(ConfigError, match="malloc_tuning"):
        broker_config_from_dict({"malloc_tuning": "no"})
