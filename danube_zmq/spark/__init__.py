"""Topics as a Spark data source and sink (pyspark.sql.datasource): `format("danube")`.

    from danube_zmq.spark import spark_session
    spark = spark_session("local[2]")  # or register DanubeDataSource in a session of your own

docs/spark.md has the options, the columns and the guarantees. pyspark comes with the
`report` extra.
"""

from __future__ import annotations

from typing import Any

__all__ = ["spark_session"]


def spark_session(master: str, *, app_name: str = "danube", **options: Any) -> Any:
    """`danube_zmq.report.spark.spark_session` (Spark's workers run this Python, which
    has danube-zmq) with the topics' data source registered beside the snapshots'."""
    from danube_zmq.report.spark import spark_session as session
    from danube_zmq.spark.datasource import DanubeDataSource

    spark = session(master, app_name=app_name, **options)
    spark.dataSource.register(DanubeDataSource)
    return spark
