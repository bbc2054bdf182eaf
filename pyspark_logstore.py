"""Auto-registration of ``format("logstore")``: Spark imports every top-level ``pyspark_*``
module it can find and registers its ``DefaultSource``. The DataSource lives in ``datasource/``.
"""

from datasource.source import LogStoreDataSource as DefaultSource

__all__ = ["DefaultSource"]
