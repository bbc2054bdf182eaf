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
