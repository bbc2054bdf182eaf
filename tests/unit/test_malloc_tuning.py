"""The broker process's malloc thresholds (``logstore.main.tune_malloc``, ``malloc_tuning``).

Goal: ``tune_malloc`` sets glibc's thresholds unless the operator chose them (``MALLOC_*``
variables, ``GLIBC_TUNABLES``), and ``malloc_tuning`` is checked like any other key. Method:
``tune_malloc`` in a child interpreter without the variables (the allocator is process-wide,
so the test process's own is left alone; only mallopt's success is seen, not its effect), and
in this process with them (it returns before calling mallopt); the config parser for the key.
``tests/integration/test_cli.py`` checks that ``broker start`` calls it, or not.
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
def test_a_broker_process_on_glibc_sets_its_thresholds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*MALLOC_ENV, "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert tuned_in_child(dict(os.environ)) == "True"


@pytest.mark.parametrize("environ", [
    {MALLOC_ENV[0]: "131072"}, {MALLOC_ENV[1]: "131072"},
    {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=4096"}])
def test_the_operators_own_malloc_settings_win(environ: dict[str, str]) -> None:
    assert tune_malloc(environ) is False


def test_malloc_tuning_is_a_checked_boolean_key() -> None:
    assert broker_config_from_dict({}).malloc_tuning is True
    assert broker_config_from_dict({"malloc_tuning": False}).malloc_tuning is False
    with pytest.raises(ConfigError, match="malloc_tuning"):
        broker_config_from_dict({"malloc_tuning": "no"})
