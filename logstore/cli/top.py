"""The ``logstore top`` command: a live view of the cluster in a terminal.

Owns: asking every live broker for its figures once a second (``Admin.describe_broker_metrics``,
which each broker answers from the same sources as its Prometheus endpoint, whether or not it
has one), turning two consecutive answers into rates, and drawing one screen: the brokers
(controller, partitions, leaders, under-replicated), the topics with their in and out rates,
the under-replicated partitions (from the metadata: ISR smaller than the replicas), and the
groups with the largest lag (each coordinator reports its own). Interactive, it draws in the
terminal's alternate screen with plain ANSI sequences (so it works over SSH, with no terminal
library), redraws every ``--interval`` seconds, and exits on ``q`` or Ctrl-C; when stdout is
not a terminal, or with ``--once``, it prints one plain-text snapshot (two samples an interval
apart, so rates are real) and exits. Must not: talk to brokers except through ``Admin``.
"""

from __future__ import annotations

import argparse
import os
import select
import shutil
import sys
import time
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from logstore.cli.arguments import add_bootstrap, admin
from logstore.errors import ApiError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from logstore.client.admin import Admin
    from logstore.messages.metrics import DescribeBrokerMetricsResponse

Snapshot = dict[int, "DescribeBrokerMetricsResponse | ApiError"]
MAX_ROWS = 10
_ALT_SCREEN, _MAIN_SCREEN = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"
_HOME, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


def register(commands: Any) -> None:
    top = commands.add_parser("top", help="a live view of brokers, topics, under-replicated "
                                          "partitions and lagging groups (q or Ctrl-C quits)")
    top.add_argument("--once", action="store_true",
                     help="print one plain-text snapshot and exit (the default when stdout "
                          "is not a terminal)")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="refresh period, and the window of the rates (default 1)")
    top.add_argument("--rows", type=int, default=MAX_ROWS, metavar="N",
                     help=f"at most N topics, partitions and groups each (default {MAX_ROWS})")
    top.set_defaults(run=_cmd_top, usage_problem=_usage_problem)
    add_bootstrap(top)


def _usage_problem(args: argparse.Namespace) -> str | None:
    if args.interval <= 0 or args.rows <= 0:
        return "--interval and --rows must be positive"
    return None


@dataclass
class View:
    """What one screen shows: the latest snapshot, rates against the one before."""

    brokers: Snapshot
    rates: dict[str, tuple[float, float, float, float]]  # msgs in/s, bytes in/s, out...
    under_replicated: list[tuple[str, int, int, list[int], list[int]]]
    controller: int | None
    taken_at: float = field(default_factory=time.time)


def _cmd_top(args: argparse.Namespace) -> int:
    with closing(admin(args)) as client:
        if args.once or not sys.stdout.isatty():
            first = client.describe_broker_metrics(args.rows)
            time.sleep(args.interval)  # the rates' window
            print("\n".join(render(sample(client, first, args.interval, args.rows), args.rows)))
            return 0
        return _interactive(client, args.interval, args.rows, sys.stdout)


def sample(client: Admin, previous: Snapshot, elapsed_s: float, rows: int) -> View:
    """A new snapshot, with rates against ``previous`` taken ``elapsed_s`` before."""
    current = client.describe_broker_metrics(rows)
    topics = client.describe_topics()
    rates = {t.name: (0.0, 0.0, 0.0, 0.0) for t in topics if not t.internal}
    rates.update(_rates(previous, current, elapsed_s))
    return View(current, rates, [(t.name, p.partition, p.leader, p.replicas, p.isr)
                                 for t in topics for p in t.partitions
                                 if len(p.isr) < len(p.replicas)],
                client.describe_cluster().controller_id)


def _rates(before: Snapshot, after: Snapshot, elapsed_s: float
           ) -> dict[str, tuple[float, float, float, float]]:
    totals: dict[str, list[float]] = {}
    for broker_id, now in after.items():
        then = before.get(broker_id)
        if isinstance(now, ApiError) or isinstance(then, ApiError) or then is None:
            continue
        old = {t.topic: t for t in then.topics}
        for t in now.topics:
            o = old.get(t.topic)
            deltas = (t.messages_in, t.bytes_in, t.messages_out, t.bytes_out) if o is None else (
                t.messages_in - o.messages_in, t.bytes_in - o.bytes_in,
                t.messages_out - o.messages_out, t.bytes_out - o.bytes_out)
            acc = totals.setdefault(t.topic, [0.0] * 4)
            for i, d in enumerate(deltas):
                acc[i] += max(d, 0) / max(elapsed_s, 1e-9)
    return {t: (v[0], v[1], v[2], v[3]) for t, v in totals.items()}


# -- drawing ---------------------------------------------------------------------------------


def render(view: View, rows: int) -> list[str]:
    """The screen as plain text lines."""
    stamp = time.strftime("%H:%M:%S", time.localtime(view.taken_at))
    ok = [b for b in view.brokers.values() if not isinstance(b, ApiError)]
    urp = sum(b.under_replicated for b in ok)
    lines = [f"logstore top - {stamp} - {len(view.brokers)} broker(s), controller "
             f"{view.controller if view.controller is not None else '-'}, "
             f"{urp} under-replicated partition(s)", ""]
    lines += _table(["BROKER", "CONTROLLER", "PARTITIONS", "LEADERS", "UNDER-REPLICATED",
                     "OFFLINE", "METRICS"], _broker_rows(view.brokers))
    lines += [""] + _table(["TOPIC", "MSG-IN/S", "BYTES-IN/S", "MSG-OUT/S", "BYTES-OUT/S"],
                           _topic_rows(view.rates, rows))
    lines += [""] + _table(["UNDER-REPLICATED", "LEADER", "REPLICAS", "ISR"],
                           [[f"{t}-{p}", str(leader), _ids(replicas), _ids(isr)]
                            for t, p, leader, replicas, isr in view.under_replicated[:rows]])
    lines += [""] + _table(["GROUP", "STATE", "LAG", "LAG-SECONDS", "COORDINATOR"],
                           _group_rows(view.brokers, rows))
    return lines


def _broker_rows(brokers: Snapshot) -> list[list[str]]:
    out = []
    for broker_id, b in sorted(brokers.items()):
        if isinstance(b, ApiError):
            out.append([str(broker_id), "-", "-", "-", "-", "-", f"unreachable: {b.message}"])
            continue
        out.append([str(broker_id), "yes" if b.active_controller else "no",
                    str(b.partitions), str(b.leaders), str(b.under_replicated), str(b.offline),
                    b.metrics_listener or "-"])
    return out


def _topic_rows(rates: dict[str, tuple[float, float, float, float]], rows: int
                ) -> list[list[str]]:
    busiest = sorted(rates.items(), key=lambda kv: (-(kv[1][1] + kv[1][3]), kv[0]))
    return [[t, _num(r[0]), _num(r[1]), _num(r[2]), _num(r[3])]
            for t, r in busiest if not t.startswith("__")][:rows]


def _group_rows(brokers: Snapshot, rows: int) -> list[list[str]]:
    groups = [(g, broker_id) for broker_id, b in brokers.items() if not isinstance(b, ApiError)
              for g in b.groups]
    groups.sort(key=lambda x: (-x[0].lag, x[0].group_id))
    return [[g.group_id, g.state, str(g.lag),
             "-" if g.lag_seconds is None else f"{g.lag_seconds:.1f}", str(broker_id)]
            for g, broker_id in groups[:rows]]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=False)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, *rows)]


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids)) or "-"


def _num(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


# -- the interactive loop --------------------------------------------------------------------


def _interactive(client: Admin, interval: float, rows: int, out: IO[str]) -> int:
    previous, taken = client.describe_broker_metrics(rows), time.monotonic()
    with _terminal(out) as keys:
        while True:
            if keys.wait_for_quit(max(taken + interval - time.monotonic(), 0)):
                return 0
            view = sample(client, previous, time.monotonic() - taken, rows)
            previous, taken = view.brokers, time.monotonic()
            _draw(out, render(view, rows) + ["", "q or Ctrl-C quits"])
    return 0  # Ctrl-C: _terminal restored the screen and swallowed it


def _draw(out: IO[str], lines: list[str]) -> None:
    width, height = shutil.get_terminal_size()
    shown = [line[:width] + _CLEAR_LINE for line in lines[:height]]
    out.write(_HOME + "\n".join(shown) + _CLEAR_BELOW)
    out.flush()


class _Keys:
    """Waits on stdin for ``q`` (when stdin is a terminal), else only for the time."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def wait_for_quit(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if self._fd is None:
                time.sleep(max(remaining, 0))  # nothing to read: the refresh period
                return False
            ready, _, _ = select.select([self._fd], [], [], max(remaining, 0))
            if not ready:
                return False
            data = os.read(self._fd, 64)
            if not data or b"q" in data.lower():  # q, or the terminal is gone
                return True


@contextmanager
def _terminal(out: IO[str]) -> Iterator[_Keys]:
    """The alternate screen and, with stdin a terminal, keys unbuffered (Ctrl-C still
    interrupts); both restored whatever happens."""
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    out.write(_ALT_SCREEN)
    out.flush()
    try:
        with suppress(KeyboardInterrupt):
            yield _Keys(fd)
    finally:
        out.write(_MAIN_SCREEN)
        out.flush()
        if fd is not None and saved is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
