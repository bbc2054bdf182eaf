"""Helpers of the sink tests that Spark workers import (so not a test module): a source whose
exactly-once writer calls ``commit`` twice for every batch, as Spark may after a restart, and
a UDF that fails one task.

Owns: nothing but these helpers. Must not: change what the real writer does besides the
repeated call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from datasource.sink import ExactlyOnceStreamWriter
from datasource.source import LogStoreDataSource
from datasource.writer import parse_sink_options
from logstore import Admin
from tests.helpers import wait_for


class CommitTwiceWriter(ExactlyOnceStreamWriter):
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        super().commit(messages, batchId)
        super().commit(messages, batchId)  # the same messages again, after it succeeded


class CommitTwiceSource(LogStoreDataSource):
    """``format("logstore-commit-twice")``: the logstore sink, each commit made twice."""

    @classmethod
    def name(cls) -> str:
        return "logstore-commit-twice"

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        return CommitTwiceWriter(parse_sink_options(dict(self.options), True), schema)


def failing_once_staged(bootstrap: str, prefix: str) -> Callable[[str], str]:
    """A UDF for ``spark.range(0, 1000, 1, 2)``'s values that raises at task 1's last row
    (``"999"``) once a transaction whose id starts with ``prefix`` is Prepared (task 0 staged
    its rows), so the job fails with a staged task and no task still running."""

    def staged() -> bool:
        with Admin(bootstrap) as admin:
            return bool(admin.list_transactions(["Prepared"], transactional_id_prefix=prefix))

    def check(value: str) -> str:
        if value == "999":
            wait_for(staged, "task 0 staged its rows")
            raise RuntimeError("task 1 fails at its last row")
        return value

    return check
