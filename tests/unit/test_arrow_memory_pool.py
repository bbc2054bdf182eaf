"""Arrow's memory pool in the broker's process (``logstore.main.select_arrow_memory_pool``,
``arrow_memory_pool``).

Goal: the broker chooses Arrow's default pool (the system allocator unless configured) before
pyarrow is imported, the operator's ``ARROW_DEFAULT_MEMORY_POOL`` wins over the key, and the key
is checked like any other. Method: the function on a plain dict; in a child interpreter (the
default pool is made once per process, at ``import pyarrow``), the pool libarrow then really
uses; the config parser for the key. ``tests/integration/test_cli.py`` checks that
``broker start`` chooses it before anything imports pyarrow.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from logstore.config import ARROW_MEMORY_POOLS, broker_config_from_dict
from logstore.errors import ConfigError
from logstore.main import ARROW_POOL_ENV, select_arrow_memory_pool

CHILD = ("import sys; from logstore.main import select_arrow_memory_pool; "
         "select_arrow_memory_pool(sys.argv[1]); import pyarrow as pa; "
         "print(pa.default_memory_pool().backend_name)")


def pool_in_child(asked: str, environ: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", CHILD, asked], env=environ,
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_the_pool_asked_for_is_set_for_the_process() -> None:
    environ: dict[str, str] = {}
    assert select_arrow_memory_pool("system", environ) == "system"
    assert environ == {ARROW_POOL_ENV: "system"}


@pytest.mark.parametrize("empty", ["", None])
def test_the_operators_variable_wins_and_an_empty_one_does_not_count(
        empty: str | None) -> None:
    assert select_arrow_memory_pool("system", {ARROW_POOL_ENV: "jemalloc"}) == "jemalloc"
    environ = {} if empty is None else {ARROW_POOL_ENV: empty}
    assert select_arrow_memory_pool("mimalloc", environ) == "mimalloc"


@pytest.mark.parametrize("pool", ["system", "mimalloc"])
def test_chosen_before_pyarrow_is_imported_libarrow_uses_it(
        pool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ARROW_POOL_ENV, raising=False)
    assert pool_in_child(pool, dict(os.environ)) == pool


def test_arrow_memory_pool_is_a_checked_key() -> None:
    assert broker_config_from_dict({}).arrow_memory_pool == "system"
    for pool in ARROW_MEMORY_POOLS:
        assert broker_config_from_dict({"arrow_memory_pool": pool}).arrow_memory_pool == pool
    with pytest.raises(ConfigError, match="arrow_memory_pool must be one of system, mimalloc, "
                                          "jemalloc, got 'tcmalloc'"):
        broker_config_from_dict({"arrow_memory_pool": "tcmalloc"})
    with pytest.raises(ConfigError, match="arrow_memory_pool"):
        broker_config_from_dict({"arrow_memory_pool": 1})
