"""Messages of fetch sessions: one DoExchange per (client, leader, topic) on which the broker
pushes batches as the log grows, instead of a fetch request per round trip.

Owns: the declaration of the session's typed messages (``rpc/session_codec.py`` has the table
of frames that carry them). A client opens a session with a ``FetchSessionRequest`` (the
DoExchange descriptor): one topic, the partitions and positions to start from, its isolation
level, a follower's replica id (and in each ``FetchPartition`` its replica's topic id), and the
bytes of credit it grants. Then, on the same stream:

- client -> broker: ``FetchSessionCredit``, more bytes the broker may push (the client grants
  what it consumed, so the broker never has more than the granted window outstanding), with a
  follower's log end offsets after it appended (its acknowledgements: the leader advances the
  high watermark from them); ``FetchSessionUpdate``, KIP-227's incremental changes (partitions
  added, moved to a new position (a seek) or removed), numbered by ``seq``;
- broker -> client: for each partition with news a ``FetchSessionPartitionState``
  (watermarks, how many batches follow, for read_committed the aborted transactions they
  overlap), then those batches; ``FetchSessionUpdated`` once an update is applied (what
  follows for its partitions starts at their new positions); ``FetchSessionPartitionEnd`` when
  a partition leaves the session on an error (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH,
  OFFSET_OUT_OF_RANGE, a follower's INCONSISTENT_TOPIC_ID or, once the leader replaced its
  replica of a recreated topic, UNKNOWN_TOPIC_ID, ...), which the client handles as after a
  fetch and adds it again.

The session itself ends with a ``FetchSessionEnd`` frame carrying the code (a refused update,
a broker stopping), after which the client cancels the call, or with the connection (a broker
gone); a session refused at open is a Flight error carrying the code. Every message is versioned as requests are
(``tag``; decode with ``decode_versioned``). Must not: do I/O.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

from logstore.messages.base import (
    INT64_MAX,
    BrokerId,
    ErrorFields,
    Int64,
    Message,
    PartitionId,
    Request,
)
from logstore.messages.fetch import (
    DEFAULT_FETCH_MAX_BYTES,
    READ_UNCOMMITTED,
    AbortedTransaction,
    FetchPartition,
    IsolationLevelField,
)

Bytes = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024  # Kafka's max.partition.fetch.bytes


class FetchSessionPartitionEnd(ErrorFields, frozen=True, kw_only=True, tag_field="version",
                               tag=0):
    """A partition leaves the session on ``error_code``, with the offsets a client recovers
    with (a follower restarts at ``local_log_start_offset`` or ``log_start_offset``)."""

    partition: PartitionId
    high_watermark: int = -1
    log_start_offset: int = -1  # over both tiers of a tiered partition
    local_log_start_offset: int = -1
    log_end_offset: int = -1


class FetchSessionRequest(Request[FetchSessionPartitionEnd], frozen=True, kw_only=True, tag=0):
    """Opens a push session on one topic (the DoExchange descriptor). ``partitions`` start at
    their ``offset``; the broker pushes batches below the high watermark (a follower: the log
    end offset; read_committed: the last stable offset) while the client's credit lasts, at
    most ``max_bytes`` per push and ``partition_max_bytes`` per partition in it. Its
    RESPONSE is the one per-partition answer the stream carries as JSON on failure."""

    ACTION: ClassVar[str] = "fetch_session"
    RESPONSE: ClassVar[type[Message]] = FetchSessionPartitionEnd
    topic: str
    partitions: list[FetchPartition] = []
    isolation_level: IsolationLevelField = READ_UNCOMMITTED
    replica_id: BrokerId = -1
    credit_bytes: Bytes  # the window the client grants at open
    max_bytes: int = DEFAULT_FETCH_MAX_BYTES  # <= 0 is INVALID_FETCH_SIZE
    partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES  # FetchPartition.max_bytes wins
    # The client reads a partition's state and its first batch as one F frame (a broker that
    # predates the field ignores it and sends the state on its own, which the client reads).
    state_with_first_batch: bool = False


class PartitionOffset(Message, frozen=True, kw_only=True):
    partition: PartitionId
    offset: Int64


class FetchSessionCredit(Message, frozen=True, kw_only=True, tag_field="version", tag=0):
    """More bytes the broker may push; a follower adds its log end offset per partition it
    appended to since its last credit (every offset below is on its disk)."""

    credit_bytes: Bytes = 0
    log_end_offsets: list[PartitionOffset] = []


class FetchSessionUpdate(Message, frozen=True, kw_only=True, tag_field="version", tag=0):
    """Incremental changes: ``add`` subscribes partitions, or moves ones already in the
    session to a new position (a seek, or a follower's new leader epoch); ``remove``
    unsubscribes. Applied in order; the broker answers each with ``FetchSessionUpdated``."""

    seq: Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
    add: list[FetchPartition] = []
    remove: list[PartitionId] = []


class FetchSessionUpdated(Message, frozen=True, kw_only=True, tag_field="version", tag=0):
    """Update ``seq`` is applied: frames after this one come from the new positions."""

    seq: int


class FetchSessionEnd(ErrorFields, frozen=True, kw_only=True, tag_field="version", tag=0):
    """The broker ends the session with this error; the client closes its side."""


class FetchSessionPartitionState(Message, frozen=True, kw_only=True, tag_field="version",
                                 tag=0):
    """A partition's news: its watermarks now, and the number of its batches that follow
    (0 when only a watermark moved, such as the high watermark a follower learns)."""

    partition: PartitionId
    batches: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    local_log_start_offset: int = -1
    log_end_offset: int = -1
    aborted_transactions: list[AbortedTransaction] = []  # read_committed only
