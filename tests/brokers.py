"""Real broker processes on 127.0.0.1 for tests (the fixtures in conftest.py wrap these).

``broker`` is one broker per test module (tests in a module share it, so they use their own
topic names); ``broker_factory`` starts as many as a test wants and stops them after it. Each
broker is ``python -m logstore broker start --config <tmp toml>``: the same command a user runs,
with a free port and its own log directory. Startup waits for the "listening on" line with a
bounded wait and no sleeps; teardown sends SIGTERM and asserts exit code 0, so every test also
checks that the broker stops cleanly.
"""

from __future__ import annotations

import os
import queue
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pyarrow as pa

from logstore import Admin, NewTopic, Producer
from logstore.errors import ApiError
from logstore.messages.produce import ProduceAck, ProduceBatchMetadata, ProduceRequest
from logstore.rpc.client import BrokerConnection

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
READY_MARKER = "listening on"
START_MARKER = "--- starting: "  # written to the broker's stderr before each start


def free_port() -> int:
    """A port nothing listens on right now (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (a table's nested tables)
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as a TOML value")


def write_broker_toml(path: Path, settings: dict[str, Any]) -> Path:
    """Write ``settings`` as a broker TOML file; a dict value becomes a table (topic_defaults),
    and dicts inside it inline tables (remote_storage_options.client_kwargs)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for table, values in ((k, v) for k, v in settings.items() if isinstance(v, dict)):
        lines += ["", f"[{table}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def subprocess_env() -> dict[str, str]:
    """The test interpreter's environment, with the repository importable even when the package
    is not installed (as in a bare virtualenv)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# A Spark application started as a subprocess (the kill tests start a dozen) starts its JVM
# with the client JIT only and the serial collector: about 2.5 s less per start on two cores.
SPARK_JOB_JAVA_OPTIONS = "--driver-java-options '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC'"


def spark_job_env() -> dict[str, str]:
    """``subprocess_env()`` for a process that starts its own Spark session (in front of
    any PYSPARK_SUBMIT_ARGS the caller set)."""
    env = subprocess_env()
    given = env.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    env["PYSPARK_SUBMIT_ARGS"] = f"{SPARK_JOB_JAVA_OPTIONS} {given}"
    return env


class BrokerProcess:
    """One broker subprocess. The port and log directory stay the same across restarts, so a
    restarted broker finds its data and clients find the broker."""

    def __init__(self, root: Path, broker_id: int = 0, **settings: Any) -> None:
        self.root = root
        self.broker_id = broker_id
        self.port = free_port()
        self.log_dir = root / f"broker-{broker_id}"
        self.config_path = write_broker_toml(root / f"broker-{broker_id}.toml", {
            "broker_id": broker_id, "listener": f"127.0.0.1:{self.port}",
            "log_dirs": [str(self.log_dir)], **settings})
        self.stderr_path = root / f"broker-{broker_id}.stderr"
        # Its own working directory: where the kernel writes its core ("core", no pid) after
        # a crash in native code, for stderr_tail's native backtrace.
        self.cwd = root / f"broker-{broker_id}.cwd"
        self.process: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "logstore", "broker", "start",
                "--config", str(self.config_path)]

    def environment(self) -> dict[str, str]:
        """The broker process's environment (the benchmarks' brokers keep their own)."""
        return subprocess_env()

    def start(self) -> BrokerProcess:
        assert not self.running, "broker already running"
        self.cwd.mkdir(parents=True, exist_ok=True)
        for stale in _cores(self.cwd):  # an earlier run's: never reported for this one
            stale.unlink(missing_ok=True)
        with open(self.stderr_path, "a") as stderr:
            # On a line of its own: faulthandler's last line has no newline.
            stderr.write(f"\n{START_MARKER}{' '.join(self.command())}\n")
            stderr.flush()
            self.process = subprocess.Popen(
                self.command(), stdout=subprocess.PIPE, stderr=stderr, text=True,
                env=self.environment(), cwd=self.cwd)
        _allow_core_dump(self.process.pid)
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.process, self._lines),
                         name=f"broker-{self.broker_id}-stdout", daemon=True).start()
        self._wait_until_listening()
        return self

    @staticmethod
    def _pump(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        """Drain stdout for the process's whole life, so its pipe never fills up."""
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    def _wait_until_listening(self) -> None:
        try:
            while True:
                line = self._lines.get(timeout=START_TIMEOUT_S)
                if line is None:
                    code = self.process.wait(STOP_TIMEOUT_S) if self.process else None
                    raise RuntimeError(f"broker {self.broker_id} exited with {code} before "
                                       f"listening\n{self.stderr_tail()}")
                if READY_MARKER in line:
                    return
        except queue.Empty:
            self.kill(signal.SIGKILL)
            raise RuntimeError(f"broker {self.broker_id} printed no '{READY_MARKER}' line in "
                               f"{START_TIMEOUT_S:.0f}s\n{self.stderr_tail()}") from None

    def stderr_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the broker's stderr (its log). After a crash in native
        code in its latest run, faulthandler's header and the crashing thread's stack come
        first (its dump lists every thread, newest first, so a tail alone would cut the one
        that crashed), then that thread's native stack when the kernel left a core in the
        broker's working directory: gdb reads it (a few seconds) and the core is removed."""
        try:
            text = self.stderr_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no stderr)"
        starts = [i for i, line in enumerate(text) if START_MARKER in line]
        latest = text[starts[-1]:] if starts else text
        crash = _crash_report(latest) + _native_backtrace(_cores(self.cwd))
        return "\n".join(([*crash, "..."] if crash else []) + text[-lines:])

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """Send ``sig``; for a signal that ends the process, wait and return its exit code
        (negative for death by signal). SIGSTOP/SIGCONT return None at once."""
        assert self.process is not None, "broker never started"
        if self.process.poll() is None:
            self.process.send_signal(sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            return None
        return self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> int:
        """SIGTERM (after SIGCONT, in case a test left it stopped); returns the exit code."""
        assert self.process is not None, "broker never started"
        if self.process.poll() is not None:
            return self.process.returncode
        self.process.send_signal(signal.SIGCONT)
        code = self.kill(signal.SIGTERM)
        assert code is not None
        return code

    def restart(self) -> BrokerProcess:
        """Stop it cleanly if it still runs (asserting exit 0), then start it again."""
        if self.running:
            code = self.stop()
            assert code == 0, f"broker {self.broker_id} exited {code}\n{self.stderr_tail()}"
        return self.start()


def _crash_report(lines: list[str]) -> list[str]:
    """faulthandler's 'Fatal Python error' line of the last crash in ``lines`` and the stack
    of the thread it marks 'Current thread' (none when the thread that crashed runs no Python
    code, as a gRPC thread outside a callback: then its first lines say so)."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if not starts:
        return []
    dump = lines[starts[-1]:]
    current = next((i for i, line in enumerate(dump) if line.startswith("Current thread")), None)
    if current is None:
        return [*dump[:3], "(no thread is marked 'Current thread': it ran no Python code)"]
    end = next((i for i in range(current + 1, len(dump)) if not dump[i].strip()), len(dump))
    return [dump[0], *dump[current:end]]


def cores_land_in_the_working_directory() -> bool:
    """Whether a crashing broker can leave a core where ``stderr_tail`` reads it: the kernel's
    core_pattern is a relative file name and the hard core limit is not 0."""
    try:
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    except OSError:  # not Linux
        return False
    return bool(pattern) and not pattern.startswith(("|", "/")) and \
        resource.getrlimit(resource.RLIMIT_CORE)[1] != 0


def _allow_core_dump(pid: int) -> None:
    """Let broker ``pid`` dump a core into its working directory if it crashes in native code
    (faulthandler shows only Python stacks, and a crash in Arrow or gRPC needs the native one),
    only where every core lands there (``cores_land_in_the_working_directory``), so none is
    left in a system-wide crash directory."""
    if not cores_land_in_the_working_directory():
        return
    hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
    with suppress(OSError, AttributeError):  # the process is already gone; no prlimit
        resource.prlimit(pid, resource.RLIMIT_CORE, (hard, hard))


def _cores(cwd: Path) -> list[Path]:
    """The core files in a broker's own working directory (``core``, or ``core.PID`` where
    the kernel appends the pid), newest last."""
    found = [p for p in cwd.glob("core*") if p.is_file()] if cwd.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime)


def _native_backtrace(cores: list[Path], timeout_s: float = 120.0) -> list[str]:
    """The native stack of the thread that crashed, from the newest of ``cores`` with gdb
    (all are removed after: hundreds of megabytes each); nothing when there is none."""
    if not cores:
        return []
    core, gdb = cores[-1], shutil.which("gdb")
    try:
        if gdb is None:
            return [f"(a core was dumped at {core}, but gdb is not installed)"]
        result = subprocess.run(
            [gdb, "-batch", "-nx", "-iex", "set debuginfod enabled off",
             "-ex", "set print frame-arguments none", "-ex", "bt 60", sys.executable,
             str(core)], capture_output=True, text=True, errors="replace",
            timeout=timeout_s, check=False)
        frames: list[str] = []  # gdb prints frame #0 on loading the core, then in bt
        for line in result.stdout.splitlines():
            if line.startswith("#") and line[:400] not in frames[-1:]:
                frames.append(line[:400])
        if not frames:
            return [f"(gdb printed no stack for {core}: "
                    f"{result.stderr.strip()[-500:] or 'no output'})"]
        return ["native stack of the crashing thread (gdb):", *frames]
    except (OSError, subprocess.TimeoutExpired) as e:
        return [f"(gdb could not read the core at {core}: {e})"]
    finally:
        for c in cores:
            c.unlink(missing_ok=True)


class BrokerFactory:
    """Starts brokers under one directory and stops them all at teardown."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: list[BrokerProcess] = []

    def __call__(self, broker_id: int | None = None, **settings: Any) -> BrokerProcess:
        if broker_id is None:
            broker_id = len(self.brokers)
        broker = BrokerProcess(self.root, broker_id, **settings)
        self.brokers.append(broker)
        return broker.start()

    def stop_all(self) -> None:
        """SIGTERM every broker still running; each must exit 0 (a clean stop)."""
        failures = []
        for broker in self.brokers:
            if not broker.running:
                continue  # a test killed it on purpose
            try:
                code = broker.stop()
            except subprocess.TimeoutExpired:
                broker.kill(signal.SIGKILL)
                code = None
            if code != 0:
                failures.append(f"broker {broker.broker_id} exited {code} on SIGTERM\n"
                                f"{broker.stderr_tail()}")
        assert not failures, "\n".join(failures)


@contextmanager
def bounded_producer(bootstrap: str, **settings: object) -> Iterator[Producer]:
    """A producer closed with a bounded wait, so a test whose futures never resolve fails
    instead of hanging in ``close()``."""
    producer = Producer(bootstrap, **settings)
    try:
        yield producer
    finally:
        with suppress(ApiError):  # the test's own assertion says what went wrong
            producer.close(10)


def new_topic(admin: Admin, partitions: int, prefix: str = "t", **config: object) -> str:
    """Create a uniquely named topic (tests in a module share one broker)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, config=dict(config))])
    return name


def raw_produce(address: str, request: ProduceRequest, schema: pa.Schema,
                batches: list[tuple[pa.RecordBatch, ProduceBatchMetadata]]
                ) -> list[ProduceAck]:
    """Send ``batches`` on one raw produce stream to ``address`` (no Producer: what a
    hand-made client sends), each acknowledgement read before the next batch; every batch
    must be answered."""
    conn = BrokerConnection(address, timeout_s=10)
    try:
        stream = conn.open_produce(request, schema)
        try:
            acks = []
            for batch, meta in batches:
                stream.send(batch, meta)
                acks.append(stream.read_ack())
        finally:
            stream.close()
    finally:
        conn.close()
    received = [ack for ack in acks if ack is not None]
    assert len(received) == len(batches), acks
    return received
