"""Partition assignors of the consumer protocol, as pure functions.

Owns: range (the default), roundrobin, sticky and cooperative-sticky. Each takes the members'
subscriptions (member id -> topics), the partition count of every subscribed topic and, for the
sticky ones, the partitions each member owned before, and returns member id -> partitions.
Every partition of a subscribed topic goes to exactly one member subscribed to its topic (except
that cooperative-sticky holds back partitions that change owner: they are revoked first and
handed out in the follow-up rebalance). The group leader's client runs these; the coordinator
never does. Must not: do I/O or depend on anything but the base layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from logstore.model import TopicPartition

Subscriptions = Mapping[str, Sequence[str]]
PartitionCounts = Mapping[str, int]
Owned = Mapping[str, Sequence[TopicPartition]]
Assignment = dict[str, list[TopicPartition]]
Assignor = Callable[[Subscriptions, PartitionCounts, Owned], Assignment]

RANGE = "range"
ROUNDROBIN = "roundrobin"
STICKY = "sticky"
COOPERATIVE_STICKY = "cooperative-sticky"
EAGER = "eager"
COOPERATIVE = "cooperative"


def _all_partitions(subscriptions: Subscriptions, counts: PartitionCounts
                    ) -> list[TopicPartition]:
    topics = sorted({t for ts in subscriptions.values() for t in ts if counts.get(t, 0) > 0})
    return [TopicPartition(t, p) for t in topics for p in range(counts[t])]


def range_assign(subscriptions: Subscriptions, counts: PartitionCounts,
                 owned: Owned | None = None) -> Assignment:
    """Per topic, consecutive ranges of partitions to the subscribed members in member-id
    order; the first ``n % m`` members get one extra."""
    out: Assignment = {m: [] for m in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts if counts.get(t, 0) > 0})
    for topic in topics:
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        n, k = counts[topic], len(members)
        start = 0
        for i, member in enumerate(members):
            size = n // k + (1 if i < n % k else 0)
            out[member].extend(TopicPartition(topic, p) for p in range(start, start + size))
            start += size
    return out


def roundrobin_assign(subscriptions: Subscriptions, counts: PartitionCounts,
                      owned: Owned | None = None) -> Assignment:
    """All partitions in order, dealt to the members in turn, skipping a member not
    subscribed to the partition's topic."""
    out: Assignment = {m: [] for m in subscriptions}
    members = sorted(subscriptions)
    subscribed = {m: set(ts) for m, ts in subscriptions.items()}
    turn = 0
    for tp in _all_partitions(subscriptions, counts):
        for step in range(len(members)):  # bounded: at most one pass over the members
            member = members[(turn + step) % len(members)]
            if tp.topic in subscribed[member]:
                out[member].append(tp)
                turn = (turn + step + 1) % len(members)
                break
    return out


def sticky_assign(subscriptions: Subscriptions, counts: PartitionCounts,
                  owned: Owned | None = None) -> Assignment:
    """Balanced within one where subscriptions allow, keeping as many previously owned
    partitions with their owner as that balance permits."""
    partitions = _all_partitions(subscriptions, counts)
    subscribed = {m: set(ts) for m, ts in subscriptions.items()}
    out = _kept(subscribed, set(partitions), owned or {})
    placed = {tp for tps in out.values() for tp in tps}
    for tp in (tp for tp in partitions if tp not in placed):
        eligible = [m for m in sorted(out) if tp.topic in subscribed[m]]
        out[min(eligible, key=lambda m: len(out[m]))].append(tp)
    _balance(out, subscribed, len(partitions) * max(len(out), 1) + 1)
    return {m: sorted(tps) for m, tps in out.items()}


def _kept(subscribed: Mapping[str, set[str]], valid: set[TopicPartition], owned: Owned
          ) -> Assignment:
    """Previously owned partitions that may stay: still existing, still subscribed, and claimed
    by one member only (the first claim in member-id order wins)."""
    out: Assignment = {m: [] for m in subscribed}
    taken: set[TopicPartition] = set()
    for member in sorted(subscribed):
        for tp in sorted(TopicPartition(*tp) for tp in owned.get(member, ())):
            if tp in valid and tp not in taken and tp.topic in subscribed[member]:
                out[member].append(tp)
                taken.add(tp)
    return out


def _balance(out: Assignment, subscribed: Mapping[str, set[str]], max_moves: int) -> None:
    """Move one partition at a time from the most to the least loaded member that may take
    it, until no move narrows a gap of more than one (bounded by ``max_moves``)."""
    for _ in range(max_moves):
        move = _best_move(out, subscribed)
        if move is None:
            return
        source, target, tp = move
        out[source].remove(tp)
        out[target].append(tp)


def _best_move(out: Assignment, subscribed: Mapping[str, set[str]]
               ) -> tuple[str, str, TopicPartition] | None:
    by_load = sorted(out, key=lambda m: (-len(out[m]), m))
    for source in by_load:
        for target in reversed(by_load):
            if len(out[source]) - len(out[target]) <= 1:
                break
            movable = [tp for tp in out[source] if tp.topic in subscribed[target]]
            if movable:
                return source, target, movable[-1]
    return None


def cooperative_sticky_assign(subscriptions: Subscriptions, counts: PartitionCounts,
                              owned: Owned | None = None) -> Assignment:
    """The sticky assignment, minus partitions that would pass straight from one live owner
    to another: those are revoked now and assigned in the follow-up rebalance, so no
    partition ever has two owners in one generation."""
    target = sticky_assign(subscriptions, counts, owned)
    previous = {TopicPartition(*tp): m for m, tps in (owned or {}).items() if m in subscriptions
                for tp in tps}
    return {m: [tp for tp in tps if previous.get(tp, m) == m] for m, tps in target.items()}


ASSIGNORS: dict[str, Assignor] = {
    RANGE: range_assign,
    ROUNDROBIN: roundrobin_assign,
    STICKY: sticky_assign,
    COOPERATIVE_STICKY: cooperative_sticky_assign,
}

# The rebalance protocol each assignor supports: an eager member revokes everything before it
# rejoins; a cooperative one revokes only what it loses.
REBALANCE_PROTOCOL = {RANGE: EAGER, ROUNDROBIN: EAGER, STICKY: EAGER,
                      COOPERATIVE_STICKY: COOPERATIVE}


def assignor(name: str) -> Assignor:
    try:
        return ASSIGNORS[name]
    except KeyError:
        raise ValueError(f"unknown partition assignment strategy {name!r}; known: "
                         f"{', '.join(ASSIGNORS)}") from None
