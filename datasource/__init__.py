"""LogStore's Spark DataSource: ``spark.read.format("logstore")``, ``readStream`` and ``write``.

Importing this package does not import pyspark; ``register(spark)`` and ``LogStoreDataSource``
do. Sessions whose Python can import the installed ``pyspark_logstore`` module find the format
with no call at all (Spark registers the ``DefaultSource`` of every top-level ``pyspark_*``
module).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register ``format("logstore")`` in ``spark`` explicitly."""
    from datasource.source import LogStoreDataSource

    spark.dataSource.register(LogStoreDataSource)


def __getattr__(name: str) -> Any:
    if name == "LogStoreDataSource":
        from datasource.source import LogStoreDataSource

        return LogStoreDataSource
    raise AttributeError(name)


__all__ = ["LogStoreDataSource", "register"]
