"""A Spark session for reports: `local[*]` on this machine, or a standalone cluster
(`spark://host:7077`), with the `danube` data source registered.

The Python workers must run this interpreter (`PYSPARK_PYTHON`), which has danube-zmq
and pyarrow; otherwise Spark starts whatever `python3` is on the PATH. Spark's own
console progress bar is off: the report shows its own.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from danube_zmq.transport.errors import FailedPrecondition, Unavailable

__all__ = ["spark_session"]


def spark_session(master: str, *, app_name: str = "danube-report", driver_host: str = "127.0.0.1",
                  config: dict[str, str] | None = None) -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise FailedPrecondition("Spark reports need pyspark: install danube-zmq's report extra"
                                 " (./run report ... does it, or pip install -e '.[report]')") from None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", driver_host)  # no "hostname resolves to a loopback address" warning
    builder = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.driver.host", driver_host)
        .config("spark.driver.bindAddress", driver_host)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.sql.shuffle.partitions", "8")
    )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # py4j and JVM start failures come as many types
        raise Unavailable(f"Spark could not start with master {master!r}: {type(exc).__name__}: {exc}") from None
    spark.sparkContext.setLogLevel("ERROR")
    from danube_zmq.report.datasource import SnapshotDataSource

    spark.dataSource.register(SnapshotDataSource)
    return spark
