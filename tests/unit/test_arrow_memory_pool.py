"""Arrow's memory pool in the broker's process (``logstore.main.select_arrow_memory_pool``,
``arrow_memory_pool``).

Goal: the broker chooses Arrow's default pool (the system allocator unless configured) before
pyarrow is imported, the operator's ``ARROW_DEFAULT_MEMORY_POOL`` wins over the key unless it
names no pool (libarrow would then fall back to mimalloc without a word), ``broker start`` gets
that far without importing pyarrow, and the key is checked like any other. Method: the function
on a plain dict; in child interpreters (the default pool is made once per process, at ``import
pyarrow``), the pool libarrow then really uses, with jemalloc as the pool no late choice could
produce by accident (pyarrow's own default is mimalloc); the config parser for the key.
``tests/integration/test_cli.py`` checks a real ``broker start``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from logstore.config import ARROW_MEMORY_POOLS, broker_config_from_dict
from logstore.errors import ConfigError
from logstore.main import ARROW_POOL_ENV, select_arrow_memory_pool

CHILD = ("import sys; from logstore.main import select_arrow_memory_pool; "
         "select_arrow_memory_pool(sys.argv[1]); import pyarrow as pa; "
         "print(pa.default_memory_pool().backend_name)")
# What ``logstore broker start`` loads before it chooses the pool (cli/broker.py).
BEFORE_THE_CHOICE = """
import sys
from logstore.cli import build_parser
from logstore.config import broker_config_from_dict
from logstore.main import select_arrow_memory_pool, report_arrow_memory_pool, run_broker
build_parser().parse_args(["broker", "start", "--config", "broker.toml"])
broker_config_from_dict({})
print(sorted(m for m in sys.modules if m.split(".")[0] == "pyarrow"))
"""
needs_jemalloc = pytest.mark.skipif("jemalloc" not in pa.supported_memory_backends(),
                                    reason="this pyarrow has no jemalloc")


def run_child(source: str, *args: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != ARROW_POOL_ENV}
    return subprocess.run([sys.executable, "-c", source, *args], env=environ,
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_the_pool_asked_for_is_set_for_the_process() -> None:
    environ: dict[str, str] = {}
    assert select_arrow_memory_pool("system", environ) == ("system", "arrow_memory_pool")
    assert environ == {ARROW_POOL_ENV: "system"}


def test_the_operators_variable_wins_and_an_empty_one_does_not_count() -> None:
    environ = {ARROW_POOL_ENV: "jemalloc"}
    assert select_arrow_memory_pool("system", environ) == ("jemalloc", ARROW_POOL_ENV)
    assert environ == {ARROW_POOL_ENV: "jemalloc"}
    assert select_arrow_memory_pool("mimalloc", {ARROW_POOL_ENV: ""}) == \
        ("mimalloc", "arrow_memory_pool")


def test_a_variable_naming_no_pool_is_refused_not_left_to_fall_back() -> None:
    with pytest.raises(ConfigError, match="ARROW_DEFAULT_MEMORY_POOL='tcmalloc' names no "
                                          "memory pool; use one of system, mimalloc, jemalloc"):
        select_arrow_memory_pool("system", {ARROW_POOL_ENV: "tcmalloc"})


@pytest.mark.parametrize("pool", ["system", pytest.param("jemalloc", marks=needs_jemalloc)])
def test_chosen_before_pyarrow_is_imported_libarrow_uses_it(pool: str) -> None:
    assert run_child(CHILD, pool) == pool


def test_broker_start_chooses_the_pool_before_anything_imports_pyarrow() -> None:
    assert run_child(BEFORE_THE_CHOICE) == "[]"


def test_arrow_memory_pool_is_a_checked_key() -> None:
    assert broker_config_from_dict({}).arrow_memory_pool == "system"
    for pool in ARROW_MEMORY_POOLS:
        assert broker_config_from_dict({"arrow_memory_pool": pool}).arrow_memory_pool == pool
    with pytest.raises(ConfigError, match="arrow_memory_pool must be one of system, mimalloc, "
                                          "jemalloc, got 'tcmalloc'"):
        broker_config_from_dict({"arrow_memory_pool": "tcmalloc"})
    with pytest.raises(ConfigError, match="arrow_memory_pool"):
        broker_config_from_dict({"arrow_memory_pool": 1})
