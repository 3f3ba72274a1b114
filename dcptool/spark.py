"""dcptool archives and DCP changes as Spark DataFrames.

    from dcptool.spark import get_spark, read_archive, read_changes

    spark = get_spark()                          # or any SparkSession you already have
    df = read_archive(spark, "/backups/default")                    # every record
    state = read_archive(spark, "/backups/default", resolved=True)  # what restore writes
    changes = read_changes(spark, "couchbase://127.0.0.1", bucket="default",
                           username="Administrator", password="...")  # a streaming DataFrame

`read_archive` is `spark.read.format("dcptool")` and `read_changes` is
`spark.readStream.format("dcptool-stream")`; both register the data sources with the
session on first use (`register(spark)` does only that). Columns: see docs/spark.md.
"""
from __future__ import annotations

from dcptool.pipeline.dataframes import (
    ARCHIVE_FORMAT,
    STREAM_FORMAT,
    get_spark,
    read_archive,
    read_changes,
    register,
)

__all__ = ["get_spark", "register", "read_archive", "read_changes", "ARCHIVE_FORMAT", "STREAM_FORMAT"]
