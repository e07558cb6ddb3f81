"""`danube`: topics as a PySpark data source and sink (Spark 4's `pyspark.sql.datasource`).

    from danube_zmq.spark import DanubeDataSource
    spark.dataSource.register(DanubeDataSource)
    stream = (spark.readStream.format("danube").option("service_url", "tcp://127.0.0.1:6650")
              .option("topics", "/default/events").option("starting_offsets", "earliest").load())
    stream.writeStream.format("danube").option("service_url", url).option("topic", "/default/out")
          .option("checkpointLocation", "/tmp/ckpt").start()

The options, the columns and the guarantees are in docs/spark.md. Importing this
module points Spark's Python workers at this interpreter (as the snapshot source
does), which has danube-zmq.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import danube_zmq.report.datasource  # noqa: F401 (points Spark's workers at this interpreter)
from danube_zmq.schemas.types import SchemaType
from danube_zmq.spark.options import SinkOptions, SourceOptions
from danube_zmq.spark.ranges import SchemaValues, arrow_schema
from danube_zmq.spark.schema_columns import spark_type
from danube_zmq.spark.sink import TopicBatchWriter, TopicStreamWriter, check_sink_schema
from danube_zmq.spark.source import TopicBatchReader, TopicStreamReader
from danube_zmq.transport.client_protocol import SchemaInfo

__all__ = ["DanubeDataSource"]



def _rows(value: DataType) -> StructType:
    """The rows' columns, the value of type `value` (built as objects: a data source's
    worker has no JVM to parse DDL)."""
    return StructType([
        StructField("key", StringType()), StructField("value", value), StructField("topic", StringType()),
        StructField("partition", IntegerType()), StructField("offset", LongType()),
        StructField("publish_time", TimestampType()), StructField("producer_name", StringType()),
        StructField("attributes", MapType(StringType(), StringType())),
    ])


def _value_schema(options: SourceOptions) -> SchemaInfo:
    assert options.schema_subject is not None
    return options.connection.schema(options.schema_subject, options.schema_version)


class DanubeDataSource(DataSource):  # type: ignore[misc]
    @classmethod
    def name(cls) -> str:
        return "danube"

    def schema(self) -> StructType:
        options = SourceOptions.of(self.options)
        value: DataType = BinaryType()
        if options.value_format == "schema":
            info = _value_schema(options)
            value = spark_type(SchemaType(info.schema_type), info.definition)
        return _rows(value)

    def _source(self, schema: StructType) -> tuple[SourceOptions, SchemaValues | None, pa.Schema]:
        options = SourceOptions.of(self.options)
        values = None
        if options.value_format == "schema":
            info = _value_schema(options)
            values = SchemaValues(info.schema_type, info.definition)
        return options, values, arrow_schema(to_arrow_type(schema["value"].dataType))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TopicBatchReader(*self._source(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TopicStreamReader(*self._source(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = SinkOptions.of(self.options)
        check_sink_schema(schema, options)
        return TopicBatchWriter(options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = SinkOptions.of(self.options)
        check_sink_schema(schema, options)
        return TopicStreamWriter(options)
