"""A producer's numeric settings are checked before it connects anywhere: a bad value is a
ValueError naming the setting."""

from __future__ import annotations

import pytest

from logstore import Producer


@pytest.mark.parametrize(("setting", "value"), [
    ("linger_ms", -1), ("retry_backoff_ms", -1), ("max_block_ms", -1), ("batch_size", 0),
    ("max_request_size", 0), ("delivery_timeout_ms", 0), ("request_timeout_ms", 0),
    ("max_in_flight_requests_per_connection", 0), ("buffer_memory", 0),
    ("retry_backoff_ms", 1.5), ("request_timeout_ms", "30000"), ("buffer_memory", True)])
def test_a_bad_number_is_refused_naming_the_setting(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{setting} must be"):
        Producer("127.0.0.1:1", **{setting: value})  # type: ignore[arg-type]


def test_retries_below_zero_are_refused_and_zero_is_allowed() -> None:
    with pytest.raises(ValueError, match="^retries must be a non-negative integer, got -1"):
        Producer("127.0.0.1:1", retries=-1)
    Producer("127.0.0.1:1", retries=0).close()


@pytest.mark.parametrize("acks", [0, 1, "1"])
def test_idempotence_asked_for_needs_acks_all(acks: str | int) -> None:
    """Kafka raises ConfigException for enable.idempotence=true with acks 0 or 1."""
    with pytest.raises(ValueError, match=f"enable_idempotence=True needs acks='all', got "
                                         f"acks={acks!r}"):
        Producer("127.0.0.1:1", acks=acks, enable_idempotence=True)
    Producer("127.0.0.1:1", acks=acks).close()  # not asked for: off with acks 0
