"""Fixtures that run real broker processes on 127.0.0.1 (see tests/brokers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.brokers import BrokerFactory, BrokerProcess


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """``broker_factory(broker_id=None, **toml_settings)`` starts a broker for this test."""
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"))
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by the tests of a module: ``.bootstrap``, ``.process``, ``.log_dir``,
    ``.kill(sig)``, ``.restart()``."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    yield factory()
    factory.stop_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for folder in ("integration", "faults"):
        here = Path(__file__).parent / folder
        for item in items:
            if here in Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.integration)
