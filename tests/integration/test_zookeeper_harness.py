"""The test harness's ZooKeeper (tests/zookeeper.py): started from the pyspark wheel's jars, it
serves on its port, and kill -9 plus a restart keeps the port and the data, as the fault tests
that restart ZooKeeper under load rely on."""

from __future__ import annotations

from tests.zookeeper import ZooKeeperServer, four_letter_word, zk_client


def test_kill_9_and_restart_keep_the_port_and_the_data(
        private_zookeeper: ZooKeeperServer) -> None:
    assert "Mode: standalone" in four_letter_word(private_zookeeper.port)
    with zk_client(private_zookeeper.connect) as zk:
        zk.create("/kept", b"data")
    port = private_zookeeper.port
    private_zookeeper.restart(hard=True)
    assert private_zookeeper.port == port
    with zk_client(private_zookeeper.connect) as zk:
        assert zk.get("/kept")[0] == b"data"
    assert private_zookeeper.stop() is not None and not private_zookeeper.running
    assert four_letter_word(port) == ""
