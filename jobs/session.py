"""A local Spark session set up for LogStore: the demo, the tests and the benchmarks use it.

Owns: the settings every local run needs (workers on this interpreter, so they import the
installed ``logstore``; Python filter pushdown on; quiet logs; streaming checkpoints written
through Hadoop's FileSystem API). Must not: read LogStore data.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# With Spark's default checkpoint file manager (FileContext), Hadoop's local file system
# (hadoop-client 3.5) runs a `readlink` process for each link status it asks: about eight
# process spawns per micro-batch (the exactly-once copy job of
# tests/faults/test_spark_exactly_once.py: 0.1 s of each 0.45 s batch, about 1 s of the
# first). Spark's FileSystem-based manager writes the same files by rename, without them; a
# local session's checkpoints are normally on local disk, where a rename is atomic.
CHECKPOINT_FILE_MANAGER = ("org.apache.spark.sql.execution.streaming.checkpointing."
                           "FileSystemBasedCheckpointFileManager")


def local_session(app_name: str, master: str = "local[2]", **conf: Any) -> Any:
    """A SparkSession on ``master``; Python workers run on this interpreter unless
    PYSPARK_PYTHON says otherwise."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # traffic stays on loopback
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def job_session(app_name: str, master: str | None) -> Any:
    """The session of a job: spark-submit's own when it launched this driver (it sets
    PYSPARK_GATEWAY_PORT), else a local one on ``master`` (default local[2])."""
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark.sql import SparkSession

        return SparkSession.builder.appName(app_name).getOrCreate()
    return local_session(app_name, master or "local[2]")
