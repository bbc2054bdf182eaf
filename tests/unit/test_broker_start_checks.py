"""Unit tests of what a broker checks before it runs: its config file, its log directories, its
embedded metadata file, and the users command's ``--log-dir``.

Goal: a config or directory that cannot work is refused with a ConfigError naming the file,
key or directory at fault, instead of a broker that spins, deletes data or cannot serve groups.
Method: ``broker_config_from_dict`` on small dicts; ``LogDirs`` and ``LocalMetadataStore`` on
tmp_path directories; ``logstore users add`` run in-process.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from logstore.broker.log_dirs import META_FILE, LogDirs
from logstore.cli import main as cli_main
from logstore.config import broker_config_from_dict
from logstore.controller.local import METADATA_FILE, LocalMetadataStore, metadata_path
from logstore.errors import ConfigError

SOURCE = "conf/b.toml"


def refused(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as e:
        broker_config_from_dict(raw, SOURCE)
    assert str(e.value).startswith(f"{SOURCE}: ")
    return str(e.value)


def test_negative_broker_id_is_refused() -> None:
    assert "broker_id must be >= 0, got -1" in refused({"broker_id": -1})
    assert broker_config_from_dict({"broker_id": 0}).broker_id == 0


@pytest.mark.parametrize("key", ["log_retention_check_interval_ms", "log_cleaner_interval_ms"])
@pytest.mark.parametrize("value", [0, -5])
def test_background_intervals_must_be_positive(key: str, value: int) -> None:
    assert f"{key} must be positive" in refused({key: value})


def test_a_log_dir_listed_twice_is_refused() -> None:
    assert "log_dirs lists /var/ls/a twice ('/var/ls/a' and '/var/ls/b/../a')" in refused(
        {"log_dirs": ["/var/ls/a", "/var/ls/b/../a"]})


def test_min_above_max_is_refused() -> None:
    message = refused({"group_min_session_timeout_ms": 60_000,
                       "group_max_session_timeout_ms": 1_000})
    assert "group_min_session_timeout_ms (60000) must not be larger than " \
           "group_max_session_timeout_ms (1000)" in message
    # Against the other's default too.
    assert "remote_log_manager_task_retry_backoff_max_ms (30000)" in refused(
        {"remote_log_manager_task_retry_backoff_ms": 60_000})
    broker_config_from_dict({"group_min_session_timeout_ms": 1000,
                             "group_max_session_timeout_ms": 1000})


def test_log_dirs_lock_each_directory_and_record_the_broker_id(tmp_path: Path) -> None:
    first, second = LogDirs([tmp_path / "a"]), LogDirs([tmp_path / "b", tmp_path / "a"])
    first.lock()
    try:
        with pytest.raises(ConfigError, match=r"'.*/a' is in use by another running broker"):
            second.lock()
        assert first.check_broker_id(3) is False  # nothing recorded yet: a first start
        assert not (tmp_path / "a" / META_FILE).exists()
        first.record_broker_id(3)
        assert "broker.id=3" in (tmp_path / "a" / META_FILE).read_text()
        assert first.check_broker_id(3) is True
        with pytest.raises(ConfigError, match=r"a/meta.properties records broker.id=3 but the "
                                              r"config says broker_id=4"):
            first.check_broker_id(4)
    finally:
        first.release()
    second.lock()  # free again once released
    second.release()


def test_unusable_log_dirs_entry_is_named(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for entry, why in ((tmp_path / "afile", "it is not a directory"),
                       (tmp_path / "afile" / "sub", "Not a directory")):
        with pytest.raises(ConfigError, match=rf"log_dirs entry '{entry}' cannot be used .*{why}"):
            LogDirs([tmp_path / "ok", entry]).lock()
    LogDirs([tmp_path / "ok"]).lock()  # the first entry's lock was let go


def test_metadata_file_is_found_in_any_log_dir(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert metadata_path([a, b]) == a / METADATA_FILE  # new: in the first
    (b / METADATA_FILE).write_text("{}")
    assert metadata_path([a, b]) == b / METADATA_FILE
    (a / METADATA_FILE).write_text("{}")
    with pytest.raises(ConfigError, match="several log_dirs hold an embedded metadata file"):
        metadata_path([a, b])


@pytest.mark.parametrize("text", ['{"topics": ', '[1, 2]', '{"topics": {"t": 5}}'])
def test_corrupt_metadata_file_is_named(tmp_path: Path, text: str) -> None:
    path = tmp_path / METADATA_FILE
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{path}: not a valid metadata file"):
        LocalMetadataStore(path, 0).start()


def test_users_add_refuses_a_log_dir_without_a_metadata_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped --log-dir gets no store of its own; --init makes the first one."""
    def add(*where: str) -> int:
        monkeypatch.setattr("sys.stdin", io.StringIO("pw\n"))
        return cli_main(["users", "add", "alice", *where])

    typo = tmp_path / "dta"
    assert add("--log-dir", str(typo)) == 1
    assert f"{typo} holds no {METADATA_FILE}" in capsys.readouterr().err
    assert not typo.exists()
    assert add("--init", "--log-dir", str(typo)) == 0
    assert add("--log-dir", str(typo)) == 0
    store = LocalMetadataStore(typo / METADATA_FILE, 0)
    store.start()
    assert "alice" in store.scram_credentials()
