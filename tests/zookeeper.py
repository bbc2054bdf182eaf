"""A real ZooKeeper server for tests, started from the jars in the pyspark wheel (no apt).

``ZooKeeperServer(root)`` runs ``java -cp <jars> org.apache.zookeeper.server.ZooKeeperServerMain
<root>/zoo.cfg`` on a free 127.0.0.1 port with its data directory under ``root``. Startup waits
until the ``srvr`` four-letter command answers ``Mode: standalone`` (bounded, no fixed sleep).
``stop()`` sends SIGTERM then SIGKILL, ``kill()`` is kill -9, and ``start()`` after either one
brings the server back on the same port and data directory, so sessions, ephemeral znodes and
data survive a restart as they do in production. ``expire_session``, ``zk_client`` and
``ListenerProbe`` help tests inject session expiry, look at znodes and wait on metadata changes.

Only the jars ZooKeeperServerMain loads are put on the class path (found by trial: without
metrics-core the server dies creating its metrics, without snappy-java it dies loading its
snapshot, and log4j gives it a log file), which keeps the JVM start near one second.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.brokers import free_port

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.05
WAIT_TIMEOUT_S = 20.0
TICK_TIME_MS = 200
MAX_SESSION_TIMEOUT_MS = 60_000
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
# Jar name patterns under <pyspark>/jars; each must match exactly one file.
JARS = ("zookeeper-[0-9]*.jar", "zookeeper-jute-*.jar", "slf4j-api-*.jar", "metrics-core-*.jar",
        "snappy-java-*.jar", "log4j-api-*.jar", "log4j-core-*.jar", "log4j-slf4j2-impl-*.jar")


def java_available() -> bool:
    return shutil.which("java") is not None


def zookeeper_classpath() -> str:
    """The class path of ZooKeeperServerMain, from the pyspark wheel's jars directory."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyspark is not installed; its wheel provides the ZooKeeper jars")
    jars_dir = Path(list(spec.submodule_search_locations)[0]) / "jars"
    paths = []
    for pattern in JARS:
        found = sorted(glob.glob(str(jars_dir / pattern)))
        if len(found) != 1:
            raise RuntimeError(f"expected one {pattern} in {jars_dir}, found {found}")
        paths.append(found[0])
    return os.pathsep.join(paths)


def four_letter_word(port: int, command: str = "srvr", timeout_s: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command and return the reply ('' if nobody answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout_s) as s:
            s.sendall(command.encode())
            chunks = []
            while chunk := s.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return ""


class ZooKeeperServer:
    """One standalone ZooKeeper process; the port and data directory survive restarts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.data_dir = root / "data"
        self.config_path = root / "zoo.cfg"
        self.log_path = root / "zookeeper.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._write_config()

    @property
    def connect(self) -> str:
        """The connect string without a chroot."""
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _write_config(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("\n".join([
            f"tickTime={TICK_TIME_MS}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            # The default upper bound is 20 ticks (4 s here): a client asking for a longer
            # session would silently get 4 s.
            f"maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok,stat",
        ]) + "\n")

    def command(self) -> list[str]:
        return ["java", "-Xmx256m", "-Dlog4j2.level=INFO", "-cp", zookeeper_classpath(),
                MAIN_CLASS, str(self.config_path)]

    def start(self) -> ZooKeeperServer:
        assert not self.running, "ZooKeeper already running"
        with open(self.log_path, "ab") as out:
            out.write(f"--- starting: {' '.join(self.command())}\n".encode())
            out.flush()
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                            cwd=self.root)
        self._wait_until_serving()
        return self

    def _wait_until_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if "Mode: standalone" in four_letter_word(self.port):
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {self.process.returncode} before "
                                   f"serving\n{self.log_tail()}")
            time.sleep(POLL_S)  # polling a socket: there is no event to wait on
        self.kill()
        raise RuntimeError(f"ZooKeeper did not serve on port {self.port} within "
                           f"{START_TIMEOUT_S:.0f}s\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """Send ``sig`` (kill -9 by default) and wait for the exit; None if it never ran."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if the JVM has not exited within the stop timeout."""
        try:
            return self.kill(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            return self.kill(signal.SIGKILL)

    def restart(self, hard: bool = True) -> ZooKeeperServer:
        """kill -9 (or SIGTERM when ``hard`` is false) and start again, same port and data."""
        if hard:
            self.kill()
        else:
            self.stop()
        return self.start()


def expire_session(connect: str, client_id: tuple[int, bytes]) -> None:
    """Expire a session from outside, as kazoo's own test harness does: a second client that
    joins the session (same id and password) and closes it ends it on the server, so the first
    client's next answer is 'session expired'."""
    from kazoo.client import KazooClient

    other = KazooClient(hosts=connect, client_id=client_id)
    other.start(timeout=STOP_TIMEOUT_S)
    other.stop()
    other.close()


@contextmanager
def zk_client(connect: str) -> Iterator[Any]:
    """A plain kazoo client, for tests that look at znodes directly."""
    from kazoo.client import KazooClient

    client = KazooClient(hosts=connect)
    client.start(timeout=STOP_TIMEOUT_S)
    try:
        yield client
    finally:
        client.stop()
        client.close()


class ListenerProbe:
    """A metadata listener to wait on: ``wait_until(predicate)`` checks the predicate again
    each time the store calls the listener, until it holds or the deadline passes."""

    def __init__(self, store: Any) -> None:
        self._cond = threading.Condition()
        self.calls = 0
        store.add_listener(self)

    def __call__(self) -> None:
        with self._cond:
            self.calls += 1
            self._cond.notify_all()

    def wait_until(self, predicate: Callable[[], bool], what: str,
                   timeout_s: float = WAIT_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
                # Bounded, so a change whose listener call came before the predicate could
                # see it is still noticed.
                self._cond.wait(min(remaining, 1.0))
