"""Fixtures that run real broker processes (tests/brokers.py), a real ZooKeeper
(tests/zookeeper.py) and a real S3 endpoint (tests/moto_s3.py) on 127.0.0.1, the replayable seed
of randomised tests, and the markers every test gets from its folder (the one place tests are
marked).

Markers by folder: integration/ -> ``integration``; faults/ -> ``integration`` and ``faults``
(they run real processes too, so ``-m "not integration"`` leaves them out); spark/ -> ``spark``.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.brokers import BrokerFactory, BrokerProcess
from tests.zookeeper import ZooKeeperServer, java_available

if TYPE_CHECKING:
    from tests.moto_s3 import MotoS3


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerFactory]:
    """``broker_factory(broker_id=None, **toml_settings)`` starts a broker for this test."""
    factory = BrokerFactory(tmp_path_factory.mktemp("brokers"))
    yield factory
    factory.stop_all()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker shared by the tests of a module: ``.bootstrap``, ``.process``, ``.log_dir``,
    ``.kill(sig)``, ``.restart()``. A group's first join is not held back
    (``group_initial_rebalance_delay_ms`` 0 instead of Kafka's 3 s)."""
    factory = BrokerFactory(tmp_path_factory.mktemp("broker"))
    yield factory(group_initial_rebalance_delay_ms=0)
    factory.stop_all()


SEED_VARIABLE = "LOGSTORE_TEST_SEED"

MARKERS_BY_FOLDER: dict[str, tuple[str, ...]] = {
    "integration": ("integration",),
    "faults": ("integration", "faults"),
    "spark": ("spark",),
}


@pytest.fixture
def seed() -> int:
    """The seed of a randomised test: LOGSTORE_TEST_SEED when set (to replay a failure), else
    a fresh one. Printed, so pytest shows it with a failing test's captured output."""
    text = os.environ.get(SEED_VARIABLE, "").strip()
    value = int(text) if text else random.randrange(2**32)
    print(f"{SEED_VARIABLE}={value} replays this test")
    return value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if not path.is_relative_to(root):
            continue
        folder = path.relative_to(root).parts[0]
        for name in MARKERS_BY_FOLDER.get(folder, ()):
            item.add_marker(getattr(pytest.mark, name))


def _skip_without_java() -> None:
    if not java_available():
        pytest.skip("no 'java' on PATH: the ZooKeeper tests run ZooKeeper from the pyspark "
                    "wheel's jars and need Java 17")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One real ZooKeeper shared by the test run (``.connect``, ``.port``); tests isolate
    themselves with a chroot of their own (``zk_connect``) and never restart it."""
    _skip_without_java()
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def zk_connect(zookeeper: ZooKeeperServer) -> str:
    """A connect string with a chroot of this test's own, so tests never see each other."""
    return f"{zookeeper.connect}/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def private_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own, for tests that kill or restart it."""
    _skip_without_java()
    server = ZooKeeperServer(tmp_path / "zookeeper").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """One moto S3 server on 127.0.0.1 for the run, with dummy credentials in the environment
    (``.options()``, ``.create_bucket()``, ``.stop()`` / ``.start()``)."""
    from tests.moto_s3 import CREDENTIALS_ENV, MotoS3  # moto loads slowly; only when used

    with pytest.MonkeyPatch.context() as patch:
        for name, value in CREDENTIALS_ENV.items():
            patch.setenv(name, value)
        server = MotoS3().start()
        yield server
        server.stop()


@pytest.fixture
def s3_url(moto_s3: MotoS3) -> Iterator[str]:
    """``s3://<fresh bucket>/logstore`` on the moto server; the server is running again after
    the test even if the test stopped it."""
    yield f"s3://{moto_s3.create_bucket()}/logstore"
    if not moto_s3.running:
        moto_s3.start()
