"""Property tests of the partition assignors (logstore/groups/assignors.py).

Goal: every assignor gives each partition of a subscribed topic to exactly one member that
subscribes to its topic; roundrobin and the sticky ones balance within one partition when all
members subscribe to the same topics; sticky keeps the largest number of previously owned
partitions that a balanced assignment allows; cooperative-sticky never hands a partition from
one live owner straight to another, and converges to the sticky result in a second round.
Method: hypothesis generates members, topics, partition counts and previous ownership;
hypothesis prints the failing example (and its seed) on failure.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.groups.assignors import (
    ASSIGNORS,
    cooperative_sticky_assign,
    range_assign,
    roundrobin_assign,
    sticky_assign,
)
from logstore.model import TopicPartition

TOPICS = ["a", "b", "c"]
MEMBERS = st.lists(st.sampled_from([f"m{i}" for i in range(8)]), min_size=1, max_size=8,
                   unique=True)
COUNTS = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})


@st.composite
def groups(draw: st.DrawFn, same_topics: bool = False) -> tuple[dict, dict, dict]:
    members = draw(MEMBERS)
    counts = draw(COUNTS)
    if same_topics:
        topics = draw(st.lists(st.sampled_from(TOPICS), min_size=1, unique=True))
        subs = {m: list(topics) for m in members}
    else:
        subs = {m: draw(st.lists(st.sampled_from(TOPICS), min_size=1, unique=True))
                for m in members}
    every = [TopicPartition(t, p) for t in TOPICS for p in range(counts[t] + 2)]
    owners = [*members, "gone"]
    owned: dict[str, list[TopicPartition]] = {}
    for tp in draw(st.lists(st.sampled_from(every), unique=True)):
        owned.setdefault(draw(st.sampled_from(owners)), []).append(tp)
    return subs, counts, owned


def expected_partitions(subs: dict, counts: dict) -> set[TopicPartition]:
    return {TopicPartition(t, p) for ts in subs.values() for t in ts for p in range(counts[t])}


def check_exactly_once(subs: dict, counts: dict, assignment: dict) -> None:
    flat = [tp for tps in assignment.values() for tp in tps]
    assert len(flat) == len(set(flat)), "a partition assigned twice"
    assert set(flat) == expected_partitions(subs, counts)
    assert set(assignment) == set(subs)
    for member, tps in assignment.items():
        assert all(tp.topic in subs[member] for tp in tps), f"{member} got an unsubscribed topic"


@settings(max_examples=200, deadline=None)
@given(groups())
def test_every_partition_assigned_exactly_once_to_a_subscriber(group: tuple) -> None:
    subs, counts, owned = group
    for name, fn in ASSIGNORS.items():
        if name != "cooperative-sticky":
            check_exactly_once(subs, counts, fn(subs, counts, owned))


@settings(max_examples=200, deadline=None)
@given(groups(same_topics=True))
def test_balanced_within_one_with_identical_subscriptions(group: tuple) -> None:
    subs, counts, owned = group
    for fn in (roundrobin_assign, sticky_assign):
        sizes = [len(tps) for tps in fn(subs, counts, owned).values()]
        assert max(sizes) - min(sizes) <= 1, fn.__name__
    for topic in next(iter(subs.values())):  # range balances each topic on its own
        sizes = [sum(tp.topic == topic for tp in tps)
                 for tps in range_assign(subs, counts).values()]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=300, deadline=None)
@given(groups(same_topics=True))
def test_sticky_keeps_as_many_partitions_as_balance_allows(group: tuple) -> None:
    """With m members and n partitions, n % m members may hold ceil(n/m) and the others
    floor(n/m); giving the larger quotas to the members that kept most is optimal."""
    subs, counts, owned = group
    valid = expected_partitions(subs, counts)
    result = sticky_assign(subs, counts, owned)
    seen: set[TopicPartition] = set()
    kept = []
    for member in sorted(subs):
        mine = [tp for tp in sorted(owned.get(member, [])) if tp in valid and tp not in seen]
        seen.update(mine)
        kept.append(len(mine))
    n, m = len(valid), len(subs)
    quotas = [n // m + (1 if i < n % m else 0) for i in range(m)]
    best = sum(min(k, q) for k, q in zip(sorted(kept, reverse=True), quotas, strict=True))
    retained = sum(len(set(result[mem]) & set(owned.get(mem, []))) for mem in subs)
    assert retained == best


@settings(max_examples=200, deadline=None)
@given(groups(same_topics=True))
def test_cooperative_sticky_revokes_before_reassigning_and_converges(group: tuple) -> None:
    subs, counts, owned = group
    first = cooperative_sticky_assign(subs, counts, owned)
    previous = {tp: m for m, tps in owned.items() if m in subs for tp in tps}
    for member, tps in first.items():
        assert all(previous.get(tp, member) == member for tp in tps), "direct transfer"
    flat = [tp for tps in first.values() for tp in tps]
    assert len(flat) == len(set(flat))
    second = cooperative_sticky_assign(subs, counts, first)
    check_exactly_once(subs, counts, second)
    sizes = [len(tps) for tps in second.values()]
    assert max(sizes) - min(sizes) <= 1


def test_range_gives_the_first_members_the_extra_partitions() -> None:
    subs = {"m1": ["t"], "m2": ["t"], "m3": ["t"]}
    got = range_assign(subs, {"t": 7})
    assert [len(got[m]) for m in ("m1", "m2", "m3")] == [3, 2, 2]
    assert got["m1"] == [TopicPartition("t", p) for p in range(3)]


def test_sticky_moves_only_what_a_new_member_needs() -> None:
    subs = {"m1": ["t"], "m2": ["t"]}
    first = sticky_assign(subs, {"t": 6})
    subs3 = {**subs, "m3": ["t"]}
    second = sticky_assign(subs3, {"t": 6}, first)
    moved = sum(len(set(first[m]) - set(second[m])) for m in first)
    assert moved == 2 and len(second["m3"]) == 2
