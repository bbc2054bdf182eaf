"""The consumer: assigned partitions, positions, polling, and its group membership.

Fetching is the fetcher's (``client/fetcher.py``): by default one push session per (leader,
topic) on which the broker sends records as they arrive (``fetch_session=False``: one request
per (leader, topic), the next sent as soon as one returns), so decoding overlaps the network.
``poll`` returns ConsumerRecords, built from the Arrow columns as they are read
(``records_view.py``); ``poll_arrow`` returns one pyarrow Table per partition with ``offset``
and ``partition`` columns appended, without touching records one at a time. With ``group_id``
and ``subscribe``, the partitions come from the group (``client/group.py``): rebalances run
inside ``poll()`` (eager strategies revoke everything first; cooperative-sticky revokes only what
moves and rejoins), with the listener's callbacks and auto-commit on this thread, and committed
offsets start newly assigned partitions. With ``isolation_level="read_committed"`` only
committed transactional records are returned, up to the last stable offset, and committed
offsets are read stable (KIP-447); control batches are never records in either level. Must not: reach into broker internals.
"""

from __future__ import annotations

import logging
import numbers
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from logstore.client.fetcher import Drained, FetchConfig, Fetcher, MiB
from logstore.client.group import REJOIN_CODES, GroupMember, GroupSettings
from logstore.client.metadata import ClusterMetadata
from logstore.client.metrics import ClientEndpoint, ConsumerMetrics, Layout
from logstore.client.records_view import RecordsView
from logstore.client.transactions import ConsumerGroupMetadata
from logstore.errors import (
    ApiError,
    InvalidRequestError,
    NetworkError,
    OffsetOutOfRangeError,
)
from logstore.messages.fetch import READ_COMMITTED, READ_UNCOMMITTED
from logstore.model import (
    EARLIEST,
    LATEST,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from logstore.security.config import client_security, settings_of

log = logging.getLogger(__name__)

_RESET = {"earliest": EARLIEST, "latest": LATEST, "none": None}
_ISOLATION = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}

REBALANCE_ATTEMPTS = 10
MISSING_TOPIC_CHECK_S = 0.5  # how soon a subscribed topic that does not exist is asked again
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]


class ConsumerRebalanceListener:
    """Override either callback; both run on the thread that calls ``poll()``."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        """Before the partitions go (commit here when auto-commit is off)."""

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        """After new partitions arrive, before their records are fetched."""

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """The consumer was removed from the group (its session or ``max_poll_interval_ms``
        ran out): the partitions may already be another member's, and nothing can be
        committed for them. By default, as in Kafka, ``on_partitions_revoked``."""
        self.on_partitions_revoked(lost)


class Consumer:
    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9092", *,
                 group_id: str | None = None, auto_offset_reset: str = "latest",
                 fetch_max_bytes: int = 50 * MiB, max_partition_fetch_bytes: int = 1 * MiB,
                 fetch_min_bytes: int = 1, fetch_max_wait_ms: int = 500,
                 max_poll_records: int = 500, request_timeout_ms: int = 30_000,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5000,
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3000,
                 max_poll_interval_ms: int = 300_000,
                 partition_assignment_strategy: Iterable[str] = ("range",),
                 group_instance_id: str | None = None, client_id: str = "logstore-consumer",
                 metadata_max_age_ms: int = 300_000,
                 isolation_level: str = "read_uncommitted", fetch_session: bool = True,
                 metrics_listener: str | None = None, default_api_timeout_ms: int = 60_000,
                 **security: Any) -> None:
        """``fetch_session``: the broker pushes records as they arrive, on one long-lived
        session per leader and topic (False: a fetch request per round trip, as before).
        ``default_api_timeout_ms`` (Kafka's): how long an offset lookup (``end_offsets``,
        ``beginning_offsets``, ``offsets_for_times``, a position reset) waits out a leader
        election, or a new leader that does not know its end yet (which lasts until a
        follower that stopped fetching leaves the ISR: up to 1.5 times the broker's
        ``replica_lag_time_max_ms``).
        ``**security``: kafka-python's connection settings, as ``Producer`` takes them.
        ``metrics()`` returns kafka-python's figures; ``metrics_listener="host:port"`` also
        serves them to Prometheus from this process (``metrics_port``)."""
        if isolation_level not in _ISOLATION:
            raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                             f"got {isolation_level!r}")
        if auto_offset_reset not in _RESET:
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                             f"got {auto_offset_reset!r}")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be lower than session_timeout_ms")
        for name, value in (("max_poll_records", max_poll_records),
                            ("request_timeout_ms", request_timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(partition_assignment_strategy, str):  # one name, not its characters
            partition_assignment_strategy = (partition_assignment_strategy,)
        self._metadata = ClusterMetadata(bootstrap_servers, request_timeout_ms,
                                         metadata_max_age_ms=metadata_max_age_ms,
                                         security=client_security(security, "Consumer",
                                                                  _PARAMETERS))
        self._group: GroupMember | None = None if group_id is None else GroupMember(
            self._metadata, GroupSettings(
                group_id, session_timeout_ms, heartbeat_interval_ms, max_poll_interval_ms,
                tuple(partition_assignment_strategy), group_instance_id, client_id))
        self._auto_commit_s = auto_commit_interval_ms / 1000.0 if enable_auto_commit else None
        self._next_auto_commit = time.monotonic() + (self._auto_commit_s or 0)
        self._metadata_check_s = metadata_max_age_ms / 1000.0
        self._next_metadata_check = 0.0
        self._subscription: list[str] | re.Pattern[str] | None = None
        self._subscribed_counts: dict[str, int] = {}
        self._listener: Any = None
        self._commit_pool: ThreadPoolExecutor | None = None
        self._commit_thread: int | None = None  # the commit pool's thread, once it runs
        self._reset = _RESET[auto_offset_reset]
        self.isolation_level = isolation_level
        self._fetcher = Fetcher(self._metadata, FetchConfig(
            fetch_max_bytes, max_partition_fetch_bytes, fetch_min_bytes, fetch_max_wait_ms,
            _ISOLATION[isolation_level], fetch_session, default_api_timeout_ms / 1000.0),
            self._out_of_range, ConsumerMetrics())
        self._endpoint = ClientEndpoint(metrics_listener, "consumer", client_id,
                                        self._fetcher.metrics.layout) \
            if metrics_listener else None
        self.max_poll_records = max_poll_records
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        # partitions a rebalance added whose committed offsets are still to be taken (and the
        # listener still to be told); None: nothing pending
        self._awaiting_committed: set[TopicPartition] | None = None
        self._paused: set[TopicPartition] = set()
        self._wakeup = threading.Event()
        self._rotation = 0
        self._closed = False
        self._closing = False  # close() under way: its revocation's calls still work

    # -- assignment and positions ------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions``, outside any group rebalance. Refused while subscribed
        (as in Kafka: the group owns the assignment then); ``assign([])`` unsubscribes."""
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        if not tps:
            self.unsubscribe()
            return
        if self._subscription is not None:
            raise RuntimeError("assign() is refused while subscribed: subscription to topics, "
                               "a pattern and manual assignment are mutually exclusive; call "
                               "unsubscribe() first")
        for tp in tps:
            self._metadata.leader(tp)  # unknown topic or partition fails here, clearly
        self._set_assignment(tps)

    def _set_assignment(self, tps: list[TopicPartition]) -> None:
        self._assignment = list(dict.fromkeys(tps))
        keep = set(self._assignment)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in keep}
        self._fetcher.retain(keep)
        self._paused &= keep

    def subscribe(self, topics: Iterable[str] | str | None = None, pattern: str | None = None,
                  listener: Any = None) -> None:
        """Join the group for ``topics`` (a list) or ``pattern`` (a regular expression
        matched against whole topic names); partitions arrive from ``poll()``. An empty
        list unsubscribes, as in Kafka."""
        if topics is not None and pattern is None and not isinstance(topics, str):
            topics = list(topics)
            if not topics:
                self.unsubscribe()
                return
        if self._group is None:
            raise ValueError("subscribe() needs a group_id; use assign() without one")
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe() takes either topics or pattern")
        self._check_open()
        if self._subscription is None and self._assignment:
            raise RuntimeError("subscribe() is refused after assign(): manual assignment and "
                               "subscription are mutually exclusive; call unsubscribe() first "
                               "(commit the assigned partitions' positions before, if wanted)")
        self._subscription = re.compile(pattern) if pattern is not None else (
            [topics] if isinstance(topics, str) else sorted(set(topics or [])))
        self._listener = listener
        self._next_metadata_check = 0.0
        self._group.need_rejoin.set()

    def unsubscribe(self) -> None:
        self._check_open()
        failure = None
        if self._group is not None and self._subscription is not None:
            failure = self._revoke(set(self._assignment))
            self._group.leave()
        self._subscription = None
        self._set_assignment([])
        if failure is not None:
            raise failure

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def position(self, tp: TopicPartition) -> int:
        self._check_open()
        tp = self._assigned(tp)
        if tp not in self._positions:
            self._initial_positions([tp])
        return self._positions[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._check_open()
        tp = self._assigned(tp)
        if not isinstance(offset, int) or offset < 0:
            raise ValueError(f"{tp}: seek offset must be a non-negative int, got {offset!r}")
        self._set_position(tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._check_open()
        tps = [self._assigned(tp) for tp in partitions] or self._assignment
        for tp, offset in self.beginning_offsets(tps).items():
            self._set_position(self._assigned(tp), offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._check_open()
        tps = [self._assigned(tp) for tp in partitions] or self._assignment
        for tp, offset in self.end_offsets(tps).items():
            self._set_position(self._assigned(tp), offset)

    def wakeup(self) -> None:
        """Make a poll() blocked in another thread return early (with what it has)."""
        self._wakeup.set()

    def pause(self, *partitions: TopicPartition) -> None:
        self._check_open()
        self._paused |= {self._assigned(tp) for tp in partitions}

    def resume(self, *partitions: TopicPartition) -> None:
        self._check_open()
        self._paused -= {self._partition(tp) for tp in partitions}

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    # -- offsets lookups ---------------------------------------------------------------------

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        self._check_open()
        return {tp: o for tp, (o, _) in self._fetcher.list_offsets(partitions, EARLIEST).items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        self._check_open()
        return {tp: o for tp, (o, _) in self._fetcher.list_offsets(partitions, LATEST).items()}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        self._check_open()
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise ValueError(f"{tp}: timestamp must be a non-negative int (ms), got {ts!r}")
            (offset, found_ts), = self._fetcher.list_offsets([tp], ts).values()
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 \
                else None
        return out

    # -- polling -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None
             ) -> dict[TopicPartition, RecordsView]:
        """Records from assigned partitions, at most ``max_poll_records`` in all: per
        partition a Sequence of ConsumerRecords, built from the Arrow columns as they are read
        (``records_view.py``), each with its ``timestamp_type`` as its batch's header says."""
        limit = max_records or self.max_poll_records
        return {tp: RecordsView(tp, d.table, d.timestamp_type)
                for tp, d in self._poll(timeout_ms, limit).items()}

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None
                   ) -> dict[TopicPartition, pa.Table]:
        """One Table per partition (the topic's columns plus ``offset`` and ``partition``);
        no record limit unless ``max_records`` is given."""
        return {tp: d.table for tp, d in self._poll(timeout_ms, max_records or 2**62).items()}

    def _poll(self, timeout_ms: int, limit: int) -> dict[TopicPartition, Drained]:
        self._check_open()
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        fetched = False
        while True:
            self._maybe_rebalance()
            self._maybe_auto_commit()
            self._fetcher.take_arrived()
            out = self._drain_buffer(limit)
            if out:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0 and fetched:
                return {}  # what is still buffered belongs to paused partitions
            self._fetch_once(max(remaining, 0.0))
            fetched = True

    def _drain_buffer(self, limit: int) -> dict[TopicPartition, Drained]:
        # Start one partition further on each time, so a backlog in the first assigned
        # partition cannot starve the others when max_records cuts a poll short.
        n = len(self._assignment)
        self._rotation = (self._rotation + 1) % n if n else 0
        order = self._assignment[self._rotation:] + self._assignment[:self._rotation]
        drained = self._fetcher.drain([tp for tp in order if tp not in self._paused], limit)
        for tp, d in drained.items():
            self._positions[tp] = d.next_offset
        for tp in self._assignment:  # control and aborted batches passed over silently
            idle = self._fetcher.idle_position(tp) if tp not in drained else None
            if idle is not None and idle > self._positions.get(tp, idle):
                self._positions[tp] = idle
        return drained

    def _fetch_once(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for fetched records (the fetcher sends the next fetch
        straight away, so the network works while the caller decodes)."""
        wanted = [tp for tp in self._assignment if tp not in self._paused]
        unplaced = [tp for tp in wanted if tp not in self._positions]
        if unplaced:  # in one lookup, not one per partition
            self._initial_positions(unplaced)
        # With nothing to fetch (all paused or buffered), block like Kafka's poll, but wake on
        # wakeup() from another thread; a partition backing off (fetcher.retry_in) is fetched
        # again once its backoff ends.
        if not self._fetcher.fetch(wanted, self.position, timeout_s):
            retry_in = self._fetcher.retry_in()
            if self._wakeup.wait(timeout_s if retry_in is None else min(timeout_s, retry_in)):
                self._wakeup.clear()

    def _out_of_range(self, tp: TopicPartition, err: ApiError) -> None:
        """The fetcher met OFFSET_OUT_OF_RANGE: reset as auto_offset_reset says, or raise."""
        if self._reset is None:
            raise OffsetOutOfRangeError(f"{err.message} (auto_offset_reset='none')")
        log.warning("%s; resetting to the %s offset", err.message,
                    "earliest" if self._reset == EARLIEST else "latest")
        self._reset_position(tp)

    def _initial_positions(self, tps: list[TopicPartition]) -> None:
        """Where partitions without a position start: with a group_id, at the group's
        committed offsets (after assign() too, as in Kafka), else as auto_offset_reset says."""
        committed = self._group.committed(tps, self._require_stable) \
            if self._group is not None else {}
        for tp in tps:
            found = committed.get(tp)
            if found is not None and found.offset >= 0:
                self._set_position(tp, found.offset)
            else:
                self._reset_position(tp)

    def _reset_position(self, tp: TopicPartition) -> None:
        if self._reset is None:
            raise OffsetOutOfRangeError(
                f"{tp}: no position and auto_offset_reset='none'; seek first")
        (offset, _), = self._fetcher.list_offsets([tp], self._reset).values()
        self._set_position(tp, offset)

    def _set_position(self, tp: TopicPartition, offset: int) -> None:
        self._positions[tp] = offset
        self._fetcher.forget(tp)

    # -- groups ------------------------------------------------------------------------------

    def _maybe_rebalance(self) -> None:
        group = self._group
        if group is None or self._subscription is None:
            return
        if group.fenced is not None:  # another instance took this one's group_instance_id
            if self._assignment:
                self._lose(set(self._assignment))
            group.check_fenced()
        group.last_poll = time.monotonic()
        group.start_heartbeats()
        if time.monotonic() >= self._next_metadata_check:
            topics = self._subscribed_topics()
            counts = self._partition_counts(topics)
            # A subscribed topic that does not exist yet is asked for again soon (Kafka's
            # consumer does too), not only after metadata_max_age_ms.
            self._next_metadata_check = time.monotonic() + (
                MISSING_TOPIC_CHECK_S if len(counts) < len(topics) else self._metadata_check_s)
            if counts != self._subscribed_counts:
                group.need_rejoin.set()  # a new matching topic or more partitions
        for _ in range(REBALANCE_ATTEMPTS):
            if not group.need_rejoin.is_set():
                break
            try:
                self._rebalance(group)
            except REJOIN_CODES as e:
                log.info("group %s: rejoining (%s)", group.settings.group_id, e)
        if self._awaiting_committed is not None and not group.need_rejoin.is_set():
            self._take_committed(group)  # a rebalance whose offset fetch failed: again

    def _subscribed_topics(self) -> list[str]:
        if isinstance(self._subscription, re.Pattern):
            self._metadata.refresh()
            return [t for t in self._metadata.topic_names()
                    if self._subscription.fullmatch(t)]
        return list(self._subscription or [])

    def _partition_counts(self, topics: list[str]) -> dict[str, int]:
        """The subscribed topics' partition counts, from one metadata request for all of
        them (it runs every MISSING_TOPIC_CHECK_S while one is missing); a topic that does
        not exist is left out. A failed request changes nothing (no rebalance for it)."""
        if not topics:
            return {}
        try:
            self._metadata.refresh(topics)
        except (ApiError, OSError) as e:
            log.info("subscribed topics %s: metadata refresh failed: %s", topics, e)
            return dict(self._subscribed_counts)
        counts = {}
        for topic in topics:
            info = self._metadata.known(topic)
            if info is None:
                log.info("subscribed topic %s does not exist (yet)", topic)
            else:
                counts[topic] = info.num_partitions
        return counts

    def _rebalance(self, group: GroupMember) -> None:
        """One join of the group. Before it: a consumer the group removed loses what it held
        (no commit: another member may own it by now; it rejoins owning nothing); an eager
        one revokes everything (committing when auto-commit is on), a cooperative one
        commits everything it owns (Kafka's onJoinPrepare: its commit after the join would
        be at the new generation, for partitions no longer its own). The previous owner's
        partitions go to the assignor as owned either way (so ``sticky`` keeps them). A
        listener's exception is raised once the rebalance is complete, as in Kafka."""
        failure: Exception | None = None
        if group.generation_id < 0 and self._assignment:
            failure = self._lose(set(self._assignment))
        owned = set(self._assignment)
        if group.cooperative:
            if self._auto_commit_s is not None and owned:
                self._commit_quietly({tp: o for tp, o in self._positions.items()
                                      if tp in owned})
        elif owned:
            failure = self._revoke(owned) or failure
        topics = self._subscribed_topics()
        self._subscribed_counts = self._partition_counts(topics)
        outcome = group.join(topics, sorted(owned), self._partition_counts)
        new = set(outcome.assignment)
        revoked = set(self._assignment) - new
        if revoked:  # cooperative: committed before the join
            failure = self._revoke(revoked, commit=False) or failure
            group.need_rejoin.set()  # the revoked partitions go out next round
        added = new - set(self._assignment)
        self._set_assignment(sorted(new))
        log.info("group %s generation %d: assigned %s", group.settings.group_id,
                 outcome.generation_id, sorted(map(str, new)))
        self._awaiting_committed = {tp for tp in (self._awaiting_committed or set()) | added
                                    if tp in new}
        self._take_committed(group)
        if failure is not None:
            raise failure

    def _take_committed(self, group: GroupMember) -> None:
        """Position the partitions the last rebalance added at their committed offsets, then
        tell the listener. If the coordinator cannot answer, the error reaches the caller and
        the next poll asks again (the partitions are not fetched meanwhile: the poll fails
        before it fetches), so they never start from ``auto_offset_reset`` by mistake."""
        added = self._awaiting_committed or set()
        committed = group.committed(sorted(added), self._require_stable) if added else {}
        for tp, om in committed.items():
            # through _set_position: a fetch session may have pushed past the committed offset
            self._set_position(tp, om.offset)
        self._awaiting_committed = None
        if self._listener is not None:
            self._listener.on_partitions_assigned(added)

    def _revoke(self, revoked: set[TopicPartition], commit: bool = True) -> Exception | None:
        """Give ``revoked`` up (their positions committed first when auto-commit is on and
        ``commit``); the listener's exception, returned once they are gone."""
        if commit and self._auto_commit_s is not None:
            self._commit_quietly({tp: tp_pos for tp, tp_pos in self._positions.items()
                                  if tp in revoked})
        return self._give_up(revoked, "on_partitions_revoked")

    def _lose(self, lost: set[TopicPartition]) -> Exception | None:
        """The group removed this consumer: ``lost`` go without a commit."""
        log.warning("group %s: removed from the group; partitions lost: %s",
                    self._group.settings.group_id if self._group else "",
                    sorted(map(str, lost)))
        return self._give_up(lost, "on_partitions_lost")

    def _give_up(self, partitions: set[TopicPartition], callback: str) -> Exception | None:
        failure: Exception | None = None
        if self._listener is not None:
            # A listener that is not a ConsumerRebalanceListener may lack on_partitions_lost:
            # its on_partitions_revoked stands in, as the base class's default does.
            call = getattr(self._listener, callback, None) or \
                self._listener.on_partitions_revoked
            try:
                call(partitions)
            except Exception as e:  # the user's: raised once the rebalance is complete
                log.exception("the rebalance listener's %s failed", callback)
                failure = e
        self._set_assignment([tp for tp in self._assignment if tp not in partitions])
        return failure

    def _maybe_auto_commit(self) -> None:
        if self._group is None or self._auto_commit_s is None or not self._assignment:
            return
        if time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._auto_commit_s
            self._commit_quietly(dict(self._positions))

    def _commit_quietly(self, positions: dict[TopicPartition, int]) -> None:
        try:
            self._commit({tp: OffsetAndMetadata(o) for tp, o in positions.items()},
                         self._position_ids(positions))
        except ApiError as e:
            log.warning("auto-commit failed: %s", e)

    def commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None
               ) -> None:
        """Commit ``offsets`` (each the next offset to read, optionally with metadata), or
        the current positions of all assigned partitions; raises the coordinator's error."""
        self._check_open()
        self._commit(offsets)

    def _position_ids(self, positions: Iterable[TopicPartition]
                      ) -> dict[TopicPartition, str | None]:
        """The topic id each of these positions is of, where the fetcher knows it (the id its
        fetch position was taken under): a commit of positions names it rather than the metadata's
        id, which may already be a recreated topic's while the position is still the deleted
        one's (its next fetch is refused and resets it); the coordinator then refuses the
        commit (UNKNOWN_TOPIC_ID) instead of recording the old offset for the new topic."""
        return {tp: i for tp in positions
                if (i := self._fetcher.position_topic_id(tp)) is not None}

    def _commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None,
                topic_ids: Mapping[TopicPartition, str | None] | None = None) -> None:
        """``commit``, also while closing (the revocation's and close's auto-commit). Once
        ``commit_async`` was used, through its thread, after the commits asked for before
        (Kafka's commitSync completes earlier commitAsync calls first): else an older
        offset still waiting there would land after this one and move the group back."""
        chosen: dict[TopicPartition, int | OffsetAndMetadata] = \
            dict(self._positions) if offsets is None else offsets
        if offsets is None:
            topic_ids = self._position_ids(chosen)
        pool = self._commit_pool
        if pool is None or threading.get_ident() == self._commit_thread:
            self._commit_now(chosen, topic_ids)
        else:
            pool.submit(self._commit_now, chosen, topic_ids).result()

    def _commit_now(self, offsets: dict[TopicPartition, int | OffsetAndMetadata],
                    topic_ids: Mapping[TopicPartition, str | None] | None = None) -> None:
        group = self._require_group()
        if not offsets:
            return
        group.commit({TopicPartition(*tp): om if isinstance(om, OffsetAndMetadata)
                      else OffsetAndMetadata(om) for tp, om in offsets.items()},
                     as_member=self._subscription is not None and group.generation_id >= 0,
                     topic_ids=topic_ids)

    def commit_async(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None,
                     callback: CommitCallback | None = None) -> Future[None]:
        """Commit in the background; ``callback(offsets, exception_or_None)`` when done
        (``close()`` waits for the commits already asked for)."""
        self._check_open()
        self._require_group()
        chosen: dict[TopicPartition, int | OffsetAndMetadata] = \
            dict(self._positions) if offsets is None else dict(offsets)
        topic_ids = self._position_ids(chosen) if offsets is None else None
        if self._commit_pool is None:
            self._commit_pool = ThreadPoolExecutor(1, thread_name_prefix="logstore-commit",
                                                   initializer=self._mark_commit_thread)

        def run() -> None:
            error: Exception | None = None
            try:
                self._commit_now(chosen, topic_ids)
            except ApiError as e:
                error = e
            if callback is not None:
                callback({TopicPartition(*tp): o if isinstance(o, OffsetAndMetadata)
                          else OffsetAndMetadata(o) for tp, o in chosen.items()}, error)
            if error is not None:
                raise error
        return self._commit_pool.submit(run)

    def _mark_commit_thread(self) -> None:
        """The commit pool's one thread: a commit from a commit_async callback runs there
        directly (waiting on the pool from its own thread would never end)."""
        self._commit_thread = threading.get_ident()

    def committed(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        """The group's committed offset of ``tp`` (None when there is none). A read_committed
        consumer waits while a transaction's offsets for ``tp`` are pending
        (UNSTABLE_OFFSET_COMMIT, retried)."""
        self._check_open()
        tp = TopicPartition(*tp)
        return self._require_group().committed([tp], self._require_stable).get(tp)

    @property
    def _require_stable(self) -> bool:
        return self.isolation_level == "read_committed"

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What ``Producer.send_offsets_to_transaction`` needs: the group, and this member's
        generation and id (the group coordinator fences an older generation, KIP-447)."""
        group = self._require_group()
        return ConsumerGroupMetadata(group.settings.group_id, group.generation_id,
                                     group.member_id, group.settings.group_instance_id)

    def _require_group(self) -> GroupMember:
        if self._group is None:
            raise ValueError("committing offsets needs a group_id")
        return self._group

    # -- lifecycle ---------------------------------------------------------------------------

    @staticmethod
    def _partition(tp: TopicPartition) -> TopicPartition:
        if not isinstance(tp, tuple) or len(tp) != 2 or not isinstance(tp[0], str) \
                or not isinstance(tp[1], numbers.Integral):
            raise TypeError(f"expected a TopicPartition (topic, partition), got {tp!r} "
                            "(pause, resume and seek_to_* take partitions as separate "
                            "arguments, as in kafka-python)")
        return TopicPartition(*tp)

    def _assigned(self, tp: TopicPartition) -> TopicPartition:
        tp = self._partition(tp)
        if tp not in self._assignment:
            raise InvalidRequestError(f"{tp} is not assigned to this consumer")
        return tp

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the consumer is closed")

    def close(self) -> None:
        """Commit what auto-commit owes, give the partitions up (the rebalance listener's
        on_partitions_revoked runs, and may still commit, as in Kafka), let every pending
        commit_async land, leave the group, then close the connections."""
        if self._closed or self._closing:
            return
        self._closing = True
        try:
            try:
                if self._group is not None:
                    if self._subscription is not None and self._assignment:
                        self._revoke(set(self._assignment))  # a listener's failure is logged
                    elif self._auto_commit_s is not None and self._positions:
                        self._commit_quietly(dict(self._positions))  # assign(): too
                if self._commit_pool is not None:  # before leaving: a member's commits
                    # (from a commit_async callback, on the pool's thread: the calls queued
                    # behind it still run, but this thread cannot wait for them)
                    self._commit_pool.shutdown(
                        wait=threading.get_ident() != self._commit_thread)
            finally:
                if self._group is not None:
                    self._group.close(leave=self._subscription is not None)
        finally:
            self._closed = True
            self._fetcher.close()
            self._metadata.close()
            if self._endpoint is not None:
                self._endpoint.close()

    def metrics(self) -> Layout:
        """kafka-python's ``metrics()``: ``{group: {name: value}}``, e.g.
        ``metrics()["consumer-fetch-manager-metrics"]["records-lag-max"]``."""
        return self._fetcher.metrics.layout()

    @property
    def metrics_port(self) -> int | None:
        """The port of this consumer's metrics endpoint (None without one)."""
        return self._endpoint.port if self._endpoint is not None else None

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while not self._closed:
            for records in self.poll(timeout_ms=1000).values():
                yield from records


_PARAMETERS = settings_of(Consumer.__init__)

__all__ = ["Consumer", "ConsumerRebalanceListener", "NetworkError"]
