"""Partition leader election rules, as pure functions of one partition's state.

Owns: what a partition's next leader and ISR are when brokers die, return or shut down, when
the preferred replica is back in the ISR, and whether an ISR change a leader proposes is
acceptable. Kafka's rules: a new leader comes from the live ISR (the first in replica order, so
the preferred replica wins when it can); only with ``unclean_leader_election_enable`` may an
out-of-sync replica lead; every leader change moves the leader epoch on; a partition with no
eligible replica goes offline (leader -1) keeping its last ISR, so a member that returns can
lead again. Must not: do I/O.
"""

from __future__ import annotations

from logstore.controller.store import PartitionState
from logstore.errors import FencedLeaderEpochError, InvalidRequestError, NotLeaderOrFollowerError

NO_LEADER = -1


def next_state(state: PartitionState, replicas: tuple[int, ...], live: frozenset[int],
               controller_epoch: int, unclean: bool = False,
               shutting_down: frozenset[int] = frozenset()) -> PartitionState | None:
    """The state the partition should move to, or None when it is fine as it is."""
    eligible = live - shutting_down
    isr_live = tuple(r for r in state.isr if r in eligible)
    if state.leader in live and not isr_live:
        return None  # a leader in controlled shutdown with no one to take over keeps leading
    if state.leader in eligible:
        if set(isr_live) != set(state.isr):
            return PartitionState(state.leader, state.leader_epoch + 1, isr_live,
                                  controller_epoch)
        preferred = replicas[0] if replicas else NO_LEADER
        if preferred != state.leader and preferred in isr_live:
            return PartitionState(preferred, state.leader_epoch + 1, isr_live, controller_epoch)
        return None
    candidates = [r for r in replicas if r in isr_live]
    if candidates:
        return PartitionState(candidates[0], state.leader_epoch + 1, isr_live, controller_epoch)
    if unclean:
        out_of_sync = [r for r in replicas if r in eligible]
        if out_of_sync:
            return PartitionState(out_of_sync[0], state.leader_epoch + 1, (out_of_sync[0],),
                                  controller_epoch)
    if state.leader == NO_LEADER:
        return None
    # Offline: with one broker going, the ISR shrinks to what is left of it (Kafka keeps the
    # last member), so nothing outside it can be elected cleanly later.
    return PartitionState(NO_LEADER, state.leader_epoch + 1, isr_live or state.isr,
                          controller_epoch)


def check_isr_change(state: PartitionState, replicas: tuple[int, ...], live: frozenset[int],
                     leader: int, leader_epoch: int, isr: tuple[int, ...]) -> None:
    """Raise unless ``leader`` at ``leader_epoch`` may set the ISR to ``isr``."""
    if state.leader != leader:
        raise NotLeaderOrFollowerError(f"broker {leader} does not lead (leader {state.leader})")
    if state.leader_epoch != leader_epoch:
        raise FencedLeaderEpochError(f"leader epoch {leader_epoch} is not the current "
                                     f"{state.leader_epoch}")
    if leader not in isr or not set(isr) <= set(replicas):
        raise InvalidRequestError(f"isr {list(isr)} must hold the leader and only replicas "
                                  f"{list(replicas)}")
    added = set(isr) - set(state.isr)
    if not added <= live:
        raise InvalidRequestError(f"isr {list(isr)} adds brokers that are not live: "
                                  f"{sorted(added - live)}")
