"""Consumer and Admin settings are checked before anything connects, naming the setting; a
misspelt setting of any client is an error naming it, the closest known names and every
setting the client takes (not only the security ones).
"""

from __future__ import annotations

from typing import Any

import pytest

from logstore import Admin, Consumer, Producer
from logstore.errors import ConfigError

NOWHERE = "127.0.0.1:1"


@pytest.mark.parametrize(("setting", "value"), [
    ("max_poll_records", 0), ("max_poll_records", -5), ("request_timeout_ms", -1),
    ("request_timeout_ms", "30000")])
def test_a_bad_consumer_number_is_refused_naming_the_setting(setting: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{setting} must be a positive integer"):
        Consumer(NOWHERE, **{setting: value})


@pytest.mark.parametrize("value", [0, -1, "30000", 1.5])
def test_a_bad_admin_request_timeout_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="request_timeout_ms must be a positive integer"):
        Admin(NOWHERE, request_timeout_ms=value)


def test_one_assignment_strategy_name_is_one_strategy() -> None:
    consumer = Consumer(NOWHERE, group_id="g", partition_assignment_strategy="roundrobin")
    try:
        assert consumer._group is not None
        assert consumer._group.settings.strategies == ("roundrobin",)
    finally:
        consumer.close()


@pytest.mark.parametrize(("client", "typo", "meant"), [
    (Producer, "linger_msec", "linger_ms"), (Consumer, "max_poll_record", "max_poll_records"),
    (Admin, "request_timeout", "request_timeout_ms")])
def test_a_misspelt_setting_names_the_closest_and_all_settings(client: Any, typo: str,
                                                               meant: str) -> None:
    with pytest.raises(ConfigError) as raised:
        client(NOWHERE, **{typo: 5})
    message = str(raised.value)
    assert f"unknown setting {typo!r}" in message and f"did you mean {meant!r}" in message
    assert "security_protocol" in message and meant in message.split("known settings:")[1]
