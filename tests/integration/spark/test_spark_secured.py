"""The Spark source and sink against a secured broker (CURVE, JWT, roles): with the
broker's key and a token given as options they read and write; a token without
Consume (reading) or Produce (writing) fails the query with the broker's refusal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.security.tokens import TokenSigner
from danube_zmq.spark import spark_session
from danube_zmq.transport.errors import PermissionDenied
from tests.integration.conftest import allow_client_key, make_curve_keys, start_broker, write_jwt_secret

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", app_name="danube-spark-secured")
    yield session
    session.stop()


def test_options_authenticate_and_the_brokers_refusals_reach_the_query(spark: Any, tmp_path: Path) -> None:
    keys = make_curve_keys(tmp_path / "keys")
    secret, secret_env = write_jwt_secret(tmp_path)
    broker = start_broker(tmp_path, env={**keys.broker_env(), **secret_env,
                                         "DANUBE_POLICIES__DEDUPLICATION": "true"})
    try:
        allow_client_key([broker], keys)
        alice = {"server_public_key": keys.server_public_key, "client_keys": str(keys.client_secret_file),
                 "use_env": False}
        signer = TokenSigner("HS256", secret, issuer="danube", audience="danube", now_s=time.time)

        async def setup() -> None:
            async with AdminClient(broker.admin_url, **alice) as admin:
                await admin.create_namespace("etl")
                await admin.create_role("etl-read", ["Lookup", "Consume"])
                await admin.create_role("etl-write", ["Lookup", "Produce"])
                await admin.create_binding("pipeline", "user", ["etl-read", "etl-write"], "namespace:etl")
                await admin.create_binding("reader", "user", ["etl-read"], "namespace:etl")
                await admin.create_binding("writer", "user", ["etl-write"], "namespace:etl")
            async with DanubeClient(broker.url, **alice) as client:
                producer = await client.create_producer("/etl/in", dispatch="reliable")
                for i in range(10):
                    await producer.send(f"m{i}".encode())
                # The bindings reach the gateway through its watch: wait until one works.
                deadline = time.monotonic() + 30
                while True:
                    try:
                        async with DanubeClient(broker.url, use_env=False, server_public_key=keys.server_public_key,
                                                token=signer.create("pipeline", "user", 600)) as probe:
                            await (await probe.create_reader("/etl/in", start="earliest")).close()
                        return
                    except PermissionDenied:
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.3)
        asyncio.run(setup())
        token_file = tmp_path / "pipeline.jwt"
        token_file.write_text(signer.create("pipeline", "user", 600))

        def source(**credentials: str) -> Any:
            reader = spark.read.format("danube").option("service_url", broker.url).option("topics", "/etl/in") \
                .option("starting_offsets", "earliest").option("server_key", keys.server_public_key)
            for name, value in credentials.items():
                reader = reader.option(name, value)
            return reader.load()

        rows = source(token_file=str(token_file))
        assert sorted(r.value for r in rows.collect()) == [f"m{i}".encode() for i in range(10)]
        rows.select("value").write.format("danube").option("service_url", broker.url) \
            .option("topic", "/etl/out").option("server_key", keys.server_public_key) \
            .option("token_file", str(token_file)).mode("append").save()
        assert source(token=signer.create("reader", "user", 600)).count() == 10
        pattern = spark.read.format("danube").option("service_url", broker.url).option("topics_pattern", "/etl/i.*") \
            .option("starting_offsets", "earliest").option("server_key", keys.server_public_key) \
            .option("token", signer.create("reader", "user", 600)).load()  # listing the namespace needs Lookup
        assert pattern.count() == 10
        out = spark.read.format("danube").option("service_url", broker.url).option("topics", "/etl/out") \
            .option("starting_offsets", "earliest").option("server_key", keys.server_public_key) \
            .option("token_file", str(token_file)).load()
        assert sorted(r.value for r in out.collect()) == [f"m{i}".encode() for i in range(10)]

        with pytest.raises(Exception, match="user 'writer' lacks Consume on topic /etl/in"):
            source(token=signer.create("writer", "user", 600)).count()
        with pytest.raises(Exception, match="user 'reader' lacks Produce on topic /etl/out"):
            rows.select("value").write.format("danube").option("service_url", broker.url) \
                .option("topic", "/etl/out").option("server_key", keys.server_public_key) \
                .option("token", signer.create("reader", "user", 600)).mode("append").save()
        with pytest.raises(Exception, match="no credentials: this connection's CURVE key is not on the client-key"):
            source().count()  # the broker's key, no token
    finally:
        assert broker.stop() == 0, broker.log()
