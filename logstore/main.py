"""The composition root: builds one broker from a BrokerConfig and runs it until a signal.

Owns: process-level concerns of ``logstore broker start``: logging to stderr, the C allocator's
thresholds (``tune_malloc``), Arrow's memory pool (``select_arrow_memory_pool``), the startup
line on stdout that tests and scripts wait for, and SIGTERM/SIGINT handling. Must not: contain broker, storage or transport logic, or parse config
files (the CLI does that).

Why the Flight server is served from a thread: ``FlightServerBase.serve()`` waits in C++ with the
GIL released, so a Python signal handler installed for the main thread would not run until it
returned, which it never would. The main thread therefore only waits on the serving thread (an
interruptible wait), and a signal handler starts a separate thread that calls ``broker.stop()``:
``shutdown()`` blocks until in-flight requests finish, so it must not run inside the handler.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from logstore.config import ARROW_MEMORY_POOLS, BrokerConfig
from logstore.errors import ConfigError, LogstoreError

if TYPE_CHECKING:
    from logstore.broker.broker import Broker
    from logstore.controller.store import MetadataStore
    from logstore.controller.zookeeper import ZkDigest
    from logstore.tiering.store import ObjectStore

log = logging.getLogger(__name__)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SERVE_EXIT_GRACE_S = 1.0
SIGNAL_POLL_S = 0.1


class Runnable(Protocol):
    """What ``run_broker`` needs of a broker (``logstore.broker.broker.Broker`` has it)."""

    @property
    def port(self) -> int: ...

    def start(self) -> None: ...

    def serve(self) -> None: ...

    def stop(self, grace_s: float = ...) -> bool: ...


def configure_logging(level: int | str = logging.INFO) -> None:
    """Log to stderr; stdout is kept for the startup line."""
    logging.basicConfig(level=level, stream=sys.stderr, format=LOG_FORMAT)


# glibc's malloc.h parameters, and the values a broker sets (its process only).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MALLOC_MMAP_THRESHOLD = 16 * 1024 * 1024
MALLOC_TRIM_THRESHOLD = 64 * 1024 * 1024
MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Keep freed memory in the broker's process instead of giving it back to the kernel at
    once; True if set. A broker allocates buffers of a megabyte or more per batch (gRPC's
    receive buffers, reads of segment files): with glibc's defaults many are mapped fresh and
    unmapped when freed, or trimmed off their arena's top, so the next batch faults and
    zeroes new pages again. With the mmap threshold at 16 MiB and the trim threshold at
    64 MiB such buffers come from the arenas and are reused (a columnar produce cost the
    broker about 15% less CPU; README "Benchmarks"). The price: each malloc arena may keep up
    to 64 MiB it no longer uses (glibc makes up to 8 per core; ``MALLOC_ARENA_MAX`` caps
    them). Left alone when the operator chose these thresholds (``MALLOC_*`` variables or
    ``GLIBC_TUNABLES``), and where the C library is not glibc (no ``mallopt``)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(name in environ for name in MALLOC_ENV) or "mmap_threshold" in tunables or \
            "trim_threshold" in tunables or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
                and mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1)
    if done:
        log.info("malloc: mmap threshold %d MiB, trim threshold %d MiB (malloc_tuning; "
                 "set %s to choose others)", MALLOC_MMAP_THRESHOLD >> 20,
                 MALLOC_TRIM_THRESHOLD >> 20, " and ".join(MALLOC_ENV))
    return done


ARROW_POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"


def select_arrow_memory_pool(pool: str, environ: MutableMapping[str, str] = os.environ
                             ) -> tuple[str, str]:
    """Make ``pool`` Arrow's default memory pool for this process, unless the environment's
    ``ARROW_DEFAULT_MEMORY_POOL`` names one (the operator's choice wins); returns the pool and
    what chose it. A variable naming no pool pyarrow has is a ConfigError: libarrow would log
    a warning and fall back to mimalloc. Call it before pyarrow is imported: libarrow reads
    the variable when ``import pyarrow`` makes its default pool, and Flight's own allocations
    (gRPC's threads receiving and sending batches) use that pool whatever
    ``pyarrow.set_memory_pool`` says later.

    Why not pyarrow's default, mimalloc: mimalloc 3.3-3.4 (pyarrow 25 bundles 3.3, 26.0.1
    3.4.1) has reports of a SIGSEGV while a new thread sets up its heap (``mi_thread_init``),
    intermittent and early in processes starting many threads (microsoft/mimalloc#1356, on
    macOS; #1324, on gRPC's threads on Windows; apache/arrow#50908, open, with pyarrow first
    imported on a short-lived thread), and mimalloc reworked that code in August 2026. A broker
    that has just started starts dozens of threads at once (gRPC's pool, fetchers and their
    sessions, coordinators), and brokers restarted after kill -9 died of SIGSEGV right there
    in two of three CI runs of a fault test: suspected, not proven (README, Benchmarks). The
    system allocator, with the thresholds ``tune_malloc`` sets, keeps freed buffers for reuse
    as mimalloc does; produce and consume measured the same with either."""
    named = environ.get(ARROW_POOL_ENV)
    if named:
        if named not in ARROW_MEMORY_POOLS:
            raise ConfigError(f"{ARROW_POOL_ENV}={named!r} names no memory pool; use one of "
                              f"{', '.join(ARROW_MEMORY_POOLS)}, or unset it to use "
                              f"arrow_memory_pool")
        return named, ARROW_POOL_ENV
    environ[ARROW_POOL_ENV] = pool
    return pool, "arrow_memory_pool"


def report_arrow_memory_pool(asked: str, source: str) -> str:
    """Log Arrow's default memory pool in effect and what chose it (a WARNING when it is not
    ``asked``: pyarrow was imported first, or the wheel lacks that allocator); returns its
    name."""
    import pyarrow as pa

    backend = str(pa.default_memory_pool().backend_name)
    if backend == asked:
        log.info("arrow memory pool: %s (%s)", backend, source)
    else:
        log.warning("arrow memory pool: %s, not the %s that %s asks for (pyarrow was imported "
                    "before the pool was chosen, or this pyarrow has no %s)", backend, asked,
                    source, asked)
    return backend


def build_broker(config: BrokerConfig) -> Broker:
    """The one place that puts a broker together: its metadata store, its services and its
    Arrow Flight server."""
    from logstore.broker.broker import Broker  # the heavy imports happen only when run
    from logstore.metrics.broker_metrics import BrokerMetrics
    from logstore.rpc.client import BrokerConnection
    from logstore.rpc.server import FlightBrokerServer
    # Brokers talk to each other (replication, the controller) only in cluster mode, every
    # connection through this factory: the listener's security with the broker's own
    # certificate and SASL user.
    connect = None
    if config.zk_connect is not None:
        peer_security = config.security.inter_broker_client()

        def connect(address: str) -> BrokerConnection:
            return BrokerConnection(address, security=peer_security)
    metrics = BrokerMetrics(config.metrics_listener)
    broker = Broker(config, serve=lambda listener, handlers: FlightBrokerServer(
        listener, handlers, config.security, metrics.requests), store=build_metadata_store(config),
        connect=connect,
        object_store=build_object_store(config))
    metrics.attach(broker)
    return broker


def build_object_store(config: BrokerConfig) -> ObjectStore | None:
    """The remote tier's store when ``remote_storage_uri`` is set (fsspec is imported only
    then: a broker without tiering runs without the ``tiering`` extra)."""
    if config.remote_storage_uri is None:
        return None
    try:
        from logstore.tiering.fsspec_store import FsspecObjectStore
    except ImportError as e:
        raise ConfigError(f"remote_storage_uri is set but the object store cannot be opened "
                          f"({e}); install the tiering extra: pip install 'logstore[tiering]'"
                          ) from None
    return FsspecObjectStore(config.remote_storage_uri, config.remote_storage_options)


def build_metadata_store(config: BrokerConfig) -> MetadataStore:
    """ZooKeeper when ``zk_connect`` is set, else the embedded file in whichever log dir
    holds it (a new one in the first; locked while the broker runs)."""
    if config.zk_connect is not None:
        from logstore.controller.zookeeper import KazooMetadataStore  # kazoo only in cluster mode

        return KazooMetadataStore(config.zk_connect, config.broker_id,
                                  session_timeout_ms=config.zk_session_timeout_ms,
                                  digest=zk_digest(config.security.zk_set_acl))
    from logstore.controller.local import LocalMetadataStore, metadata_path

    return LocalMetadataStore(metadata_path([Path(d) for d in config.log_dirs]),
                              config.broker_id, exclusive=True)


def zk_digest(zk_set_acl: bool) -> ZkDigest | None:
    """The digest identity of ``zk_set_acl``, from the environment (never from conf/)."""
    from logstore.controller.zookeeper import ZkDigest
    from logstore.security.config import ZK_DIGEST_PASSWORD_ENV, ZK_DIGEST_USERNAME_ENV

    username = os.environ.get(ZK_DIGEST_USERNAME_ENV)
    password = os.environ.get(ZK_DIGEST_PASSWORD_ENV)
    if not zk_set_acl:
        return None
    if not username or not password:
        raise ConfigError(f"zk_set_acl = true needs ${ZK_DIGEST_USERNAME_ENV} and "
                          f"${ZK_DIGEST_PASSWORD_ENV} (the brokers' ZooKeeper digest identity)")
    return ZkDigest(username, password)


def _default_broker(config: BrokerConfig) -> Runnable:
    return build_broker(config)


class _Stopper:
    """Stops the broker once, from its own thread, whatever asks first (a signal or a crash)."""

    def __init__(self, broker: Runnable) -> None:
        self._broker = broker
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.requested = threading.Event()
        self.failed = False

    def request(self, reason: str) -> None:
        with self._lock:
            if self._thread is not None:
                log.debug("already stopping; ignoring %s", reason)
                return
            log.info("stopping on %s", reason)
            self._thread = threading.Thread(target=self._stop, name="broker-stop", daemon=True)
            self._thread.start()
            self.requested.set()

    def _stop(self) -> None:
        try:
            self._broker.stop()
        except Exception:  # reported through run_broker's exit code
            log.exception("broker stop failed")
            self.failed = True

    def join(self) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()

    def serve(self) -> None:
        """Body of the serving thread; a crashed server still stops storage cleanly."""
        try:
            self._broker.serve()
        except Exception:
            log.exception("the Flight server failed")
            self.failed = True
        with self._lock:
            if self._thread is not None:
                return
        self.request("serve() returning")


def _install_handlers(signals: list[int]) -> dict[int, Any]:
    """The handler only records the signal: taking a lock or logging inside a handler can
    deadlock when a second signal lands while the first one's handler runs."""

    def handle(signum: int, frame: object) -> None:
        signals.append(signum)

    return {sig: signal.signal(sig, handle) for sig in STOP_SIGNALS}


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def run_broker(config: BrokerConfig, make_broker: Callable[[BrokerConfig], Runnable] | None = None,
               out: IO[str] | None = None) -> int:
    """Run one broker in the foreground until SIGTERM or SIGINT; 0 after a clean stop, 1 if it
    could not start or did not stop cleanly. Must be called from the main thread (only it can
    install signal handlers)."""
    broker = (make_broker or _default_broker)(config)
    if not _start(broker, config):
        return 1
    stopper = _Stopper(broker)
    signals: list[int] = []
    previous = _install_handlers(signals)
    try:
        serving = threading.Thread(target=stopper.serve, name="flight-serve", daemon=True)
        serving.start()
        print(f"logstore broker {config.broker_id} listening on {config.host}:{broker.port}",
              file=out or sys.stdout, flush=True)
        # A timed wait, so the main thread regularly returns to the interpreter, where the
        # signal handler runs (an untimed wait can sleep through a signal taken by another
        # thread).
        while not stopper.requested.wait(SIGNAL_POLL_S):
            if signals:
                stopper.request(signal.Signals(signals[0]).name)
        stopper.join()  # the broker has stopped: storage is flushed and closed
        serving.join(SERVE_EXIT_GRACE_S)
    finally:
        _restore_handlers(previous)
    code = 1 if stopper.failed else 0
    if code == 0:
        log.info("broker %d stopped cleanly", config.broker_id)
    if serving.is_alive():
        # A client still holds a stream open, so the Flight server never finishes its shutdown
        # and its threads would block interpreter exit. Storage is already closed cleanly.
        log.warning("broker %d: open client streams did not finish; exiting anyway",
                    config.broker_id)
        logging.shutdown()
        sys.stdout.flush()
        os._exit(code)
    return code


def _start(broker: Runnable, config: BrokerConfig) -> bool:
    """Start the broker; an expected failure (port in use, bad directory) is logged in one line
    and what did start is stopped again."""
    import pyarrow as pa  # not at the top: select_arrow_memory_pool runs before its import

    try:
        broker.start()
        return True
    except (LogstoreError, OSError, pa.ArrowException) as e:
        log.error("broker %d could not start on %s: %s", config.broker_id, config.listener, e)
    try:
        broker.stop()
    except Exception:
        log.debug("stop after a failed start also failed", exc_info=True)
    return False
