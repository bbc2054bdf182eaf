"""Delivery callbacks on the producer's futures, as Kafka's clients register them.

Owns: the four ways to register one (kafka-python's ``add_callback``, ``add_errback`` and
``add_both``, concurrent.futures' ``add_done_callback``), each returning the future so calls
chain, and how a registered callback runs: with the record's metadata, its exception or its
future, and a callback that raises is logged with the topic and partition and goes no further:
the thread completing the future (one of the producer's I/O threads) and the other callbacks
carry on. Must not: decide when a future completes, nor keep callbacks (``batches.py`` does
both).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DeliveryCallback:
    """``fn(outcome, *args, **kwargs)``: the outcome is the result on success (if
    ``on_success``), the exception on failure (if ``on_failure``), or the future itself
    whichever it is (``with_future``: concurrent.futures' ``fn(future)``)."""

    fn: Callable[..., object]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    on_success: bool = True
    on_failure: bool = True
    with_future: bool = False


def run_callbacks(callbacks: Sequence[DeliveryCallback], future: object, value: object,
                  error: BaseException | None, where: str) -> None:
    """Run ``callbacks`` in order for a future completed with ``value`` or ``error``."""
    for cb in callbacks:
        if not (cb.on_failure if error is not None else cb.on_success):
            continue
        outcome = future if cb.with_future else value if error is None else error
        try:
            cb.fn(outcome, *cb.args, **(cb.kwargs or {}))
        except Exception:  # a user's callback: logged, never the producer's failure
            log.exception("%s: delivery callback %s raised; the record's other callbacks and "
                          "the producer go on", where, getattr(cb.fn, "__qualname__", cb.fn))


class CallbackFuture(Generic[T]):
    """The callback half of a producer future. A callback registered before the future
    completes runs on the producer's thread that completes it; one registered after runs at
    once, on the caller's thread."""

    __slots__ = ()  # the record futures have slots of their own: no __dict__ per send()

    def add_callback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> Self:
        """``fn(result, *args, **kwargs)`` once the future succeeds (kafka-python)."""
        return self._add(DeliveryCallback(fn, args, kwargs, on_failure=False))

    def add_errback(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> Self:
        """``fn(exception, *args, **kwargs)`` once the future fails: the exception
        ``result()`` raises (kafka-python)."""
        return self._add(DeliveryCallback(fn, args, kwargs, on_success=False))

    def add_both(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> Self:
        """``fn(result or exception, *args, **kwargs)`` whichever way it completes."""
        return self._add(DeliveryCallback(fn, args, kwargs))

    def add_done_callback(self, fn: Callable[[Self], object]) -> Self:
        """``fn(future)`` once it completes either way (concurrent.futures)."""
        return self._add(DeliveryCallback(fn, with_future=True))

    def _add(self, callback: DeliveryCallback) -> Self:
        if not self._register(callback):  # complete already: run it here and now
            value, error = self._outcome()
            run_callbacks([callback], self, value, error, self._where())
        return self

    def _register(self, callback: DeliveryCallback) -> bool:
        """Keep ``callback`` for completion; False if the future is complete already."""
        raise NotImplementedError

    def _outcome(self) -> tuple[T | None, BaseException | None]:
        """(result, None) or (None, exception) of a completed future."""
        raise NotImplementedError

    def _where(self) -> str:
        """What a failing callback's log line names: the topic and partition."""
        raise NotImplementedError
