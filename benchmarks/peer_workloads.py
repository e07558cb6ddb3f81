"""1 producer process -> peer broker -> 1 consumer process, for the peers a Python shop
would pick instead of us, through their usual Python clients (the `peers` extra).

Every message is `seq (8) + send time (8) + filler`; the consumer stops after `count`
messages or 5 s without one. Throughput = messages received / (last receive - first
send), wall clock (one machine). Client settings follow each client's documented fast
path and are stated in `NOTES` (docs/performance.md, "How each peer is driven", cites
the advice): redis-py parses with hiredis (the `peers` extra installs it; `client_stack`
records whether it was there), the asyncio clients run on uvloop as our bench does, and
the NATS producer yields to the client's flusher every 100 publishes, as nats.py's own
publish benchmark does.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import struct
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

from danube_zmq.runtime import event_loop

IDLE_S = 5.0
PIPELINE = 100

NOTES = {
    "redis_pubsub": "redis-py + hiredis, PUBLISH pipelined by 100; subscriber get_message",
    "redis_streams": "redis-py + hiredis, XADD pipelined by 100, AOF appendfsync everysec; XREADGROUP 500 + XACK",
    "redis_streams_always": "as redis_streams with appendfsync always (fsync before each reply)",
    "nats_core": "nats-py on uvloop, publish per message, a yield to the flusher every 100, flush at the end;"
                 " subscription callback",
    "nats_js": "nats-py JetStream on uvloop, file storage, publish_async window 1000; pull fetch 500 + ack",
    "mqtt_qos0": "paho-mqtt 2, QoS 0, 1000 in flight; mosquitto without persistence",
    "mqtt_qos1": "paho-mqtt 2, QoS 1 (PUBACK per message), 1000 in flight",
    "rabbit_confirm": "aio-pika, durable queue, persistent messages, publisher confirms 500 in flight;"
                      " consumer prefetch 1000, ack per message",
}


def _payload(seq: int, filler: bytes) -> bytes:
    return struct.pack(">Qq", seq, time.time_ns()) + filler


# ---------------------------------------------------------------- Redis


def redis_pubsub_producer(url: str, count: int, size: int, ready: Any, _: dict[str, Any]) -> float:
    import redis

    client = redis.Redis.from_url(url)
    ready.wait(30)
    filler = b"x" * (size - 16)
    start = time.time()
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.publish("bench", _payload(i, filler))
        if (i + 1) % PIPELINE == 0:
            pipe.execute()
    pipe.execute()
    return start


def redis_pubsub_consumer(url: str, count: int, ready: Any, _: dict[str, Any]) -> tuple[int, float]:
    import redis

    pubsub = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("bench")
    while not pubsub.subscribed:
        pubsub.get_message(timeout=0.1)
    ready.set()
    received, last = 0, time.time()
    while received < count:
        # None also stands for the subscription's own confirmation (ignored above).
        message = pubsub.get_message(timeout=1.0)
        if message is None:
            if time.time() - last > IDLE_S:
                break
            continue
        if message["type"] == "message":
            received += 1
            last = time.time()
    return received, last


def redis_streams_producer(url: str, count: int, size: int, ready: Any, _: dict[str, Any]) -> float:
    import redis

    client = redis.Redis.from_url(url)
    ready.wait(30)
    filler = b"x" * (size - 16)
    start = time.time()
    pipe = client.pipeline(transaction=False)
    for i in range(count):
        pipe.xadd("bench-stream", {"d": _payload(i, filler)})
        if (i + 1) % PIPELINE == 0:
            pipe.execute()
    pipe.execute()
    return start


def redis_streams_consumer(url: str, count: int, ready: Any, options: dict[str, Any]) -> tuple[int, float]:
    import redis

    client = redis.Redis.from_url(url)
    client.delete("bench-stream")
    client.config_set("appendfsync", options["appendfsync"])
    client.xgroup_create("bench-stream", "g", id="0", mkstream=True)
    ready.set()
    received, last = 0, time.time()
    while received < count:
        reply = client.xreadgroup("g", "c", {"bench-stream": ">"}, count=500, block=1000)
        if not reply:
            if time.time() - last > IDLE_S:
                break
            continue
        ids = [mid for mid, _ in reply[0][1]]
        client.xack("bench-stream", "g", *ids)
        received += len(ids)
        last = time.time()
    client.delete("bench-stream")
    client.config_set("appendfsync", "everysec")
    return received, last


# ---------------------------------------------------------------- NATS


def nats_core_producer(url: str, count: int, size: int, ready: Any, _: dict[str, Any]) -> float:
    import nats

    async def run() -> float:
        nc = await nats.connect(url)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 30)
        filler = b"x" * (size - 16)
        start = time.time()
        for i in range(count):
            await nc.publish("bench", _payload(i, filler))
            if i % PIPELINE == PIPELINE - 1:
                await asyncio.sleep(0)  # the client's flusher task writes what is pending
        await nc.flush()
        await nc.close()
        return start
    return event_loop.run(run())


def nats_core_consumer(url: str, count: int, ready: Any, _: dict[str, Any]) -> tuple[int, float]:
    import nats

    async def run() -> tuple[int, float]:
        nc = await nats.connect(url, pending_size=1 << 30)
        state = {"received": 0, "last": time.time()}
        done = asyncio.Event()

        async def on_message(_: Any) -> None:
            state["received"] += 1
            state["last"] = time.time()
            if state["received"] >= count:
                done.set()
        await nc.subscribe("bench", cb=on_message, pending_msgs_limit=count + 1)
        await nc.flush()
        ready.set()
        while not done.is_set() and time.time() - state["last"] < IDLE_S:
            await asyncio.sleep(0.05)
        await nc.close()
        return int(state["received"]), float(state["last"])
    return event_loop.run(run())


def nats_js_producer(url: str, count: int, size: int, ready: Any, _: dict[str, Any]) -> float:
    import nats

    async def run() -> float:
        nc = await nats.connect(url)
        js = nc.jetstream(publish_async_max_pending=1000)
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 30)
        filler = b"x" * (size - 16)
        start = time.time()
        for i in range(count):
            await js.publish_async("bench-js", _payload(i, filler))
        await js.publish_async_completed()
        await nc.close()
        return start
    return event_loop.run(run())


def nats_js_consumer(url: str, count: int, ready: Any, _: dict[str, Any]) -> tuple[int, float]:
    import nats
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.api import StorageType, StreamConfig

    async def run() -> tuple[int, float]:
        nc = await nats.connect(url)
        js = nc.jetstream()
        try:
            await js.delete_stream("BENCH")
        except Exception:  # absent: fine
            pass
        await js.add_stream(StreamConfig(name="BENCH", subjects=["bench-js"], storage=StorageType.FILE))
        pull = await js.pull_subscribe("bench-js", durable="c")
        ready.set()
        received, last = 0, time.time()
        while received < count and time.time() - last < IDLE_S:
            try:
                batch = await pull.fetch(500, timeout=1)
            except NatsTimeout:
                continue
            for message in batch:
                await message.ack()
            received += len(batch)
            last = time.time()
        await js.delete_stream("BENCH")
        await nc.close()
        return received, last
    return event_loop.run(run())


# ---------------------------------------------------------------- MQTT (mosquitto)


def _mqtt_client(address: str, client_id: str) -> Any:
    import paho.mqtt.client as mqtt

    host, port = address.rsplit(":", 1)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.connect(host, int(port))
    return client


def mqtt_producer(address: str, count: int, size: int, ready: Any, options: dict[str, Any]) -> float:
    import paho.mqtt.client as mqtt

    client = _mqtt_client(address, "bench-producer")
    client.loop_start()
    ready.wait(30)
    filler, qos = b"x" * (size - 16), options["qos"]
    start = time.time()
    info = None
    for i in range(count):
        info = client.publish("bench", _payload(i, filler), qos=qos)
        while info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:  # the 16-bit message id space is full: wait for PUBACKs
            time.sleep(0.001)
            info = client.publish("bench", _payload(i, filler), qos=qos)
    if info is not None:
        info.wait_for_publish(60)
    client.loop_stop()
    client.disconnect()
    return start


def mqtt_consumer(address: str, count: int, ready: Any, options: dict[str, Any]) -> tuple[int, float]:
    import threading

    client = _mqtt_client(address, "bench-consumer")
    state = {"received": 0, "last": time.time()}
    done, subscribed = threading.Event(), threading.Event()

    def on_message(*_: Any) -> None:
        state["received"] += 1
        state["last"] = time.time()
        if state["received"] >= count:
            done.set()
    client.on_message = on_message
    client.on_subscribe = lambda *_: subscribed.set()
    client.subscribe("bench", qos=options["qos"])
    client.loop_start()
    subscribed.wait(10)
    ready.set()
    while not done.wait(0.1) and time.time() - state["last"] < IDLE_S:
        pass
    client.loop_stop()
    client.disconnect()
    return int(state["received"]), float(state["last"])


# ---------------------------------------------------------------- RabbitMQ


def rabbit_producer(url: str, count: int, size: int, ready: Any, options: dict[str, Any]) -> float:
    import aio_pika

    async def run() -> float:
        connection = await aio_pika.connect(url)
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        await asyncio.get_running_loop().run_in_executor(None, ready.wait, 30)
        filler, window = b"x" * (size - 16), options["window"]
        start = time.time()
        for first in range(0, count, window):  # `window` publishes in flight, then their confirms
            await asyncio.gather(*(exchange.publish(aio_pika.Message(_payload(i, filler), delivery_mode=2),
                                                    routing_key="bench")
                                   for i in range(first, min(count, first + window))))
        await connection.close()
        return start
    return event_loop.run(run())


def rabbit_consumer(url: str, count: int, ready: Any, _: dict[str, Any]) -> tuple[int, float]:
    import aio_pika

    async def run() -> tuple[int, float]:
        connection = await aio_pika.connect(url)
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        with contextlib.suppress(Exception):
            await channel.queue_delete("bench")
        queue = await channel.declare_queue("bench", durable=True)
        ready.set()
        received, last = 0, time.time()
        async with queue.iterator() as messages:
            while received < count:
                try:
                    message = await asyncio.wait_for(messages.__anext__(), IDLE_S)
                except TimeoutError:
                    break
                await message.ack()
                received += 1
                last = time.time()
        await channel.queue_delete("bench")
        await connection.close()
        return received, last
    return event_loop.run(run())


# ---------------------------------------------------------------- running one


WORKLOADS: dict[str, tuple[str, Callable[..., float], Callable[..., tuple[int, float]], dict[str, Any]]] = {
    "redis_pubsub": ("redis", redis_pubsub_producer, redis_pubsub_consumer, {}),
    "redis_streams": ("redis", redis_streams_producer, redis_streams_consumer, {"appendfsync": "everysec"}),
    "redis_streams_always": ("redis", redis_streams_producer, redis_streams_consumer, {"appendfsync": "always"}),
    "nats_core": ("nats", nats_core_producer, nats_core_consumer, {}),
    "nats_js": ("nats", nats_js_producer, nats_js_consumer, {}),
    "mqtt_qos0": ("mosquitto", mqtt_producer, mqtt_consumer, {"qos": 0}),
    "mqtt_qos1": ("mosquitto", mqtt_producer, mqtt_consumer, {"qos": 1}),
    "rabbit_confirm": ("rabbitmq", rabbit_producer, rabbit_consumer, {"window": 500}),
}


def _consumer_main(consumer: Callable[..., tuple[int, float]], url: str, count: int, ready: Any, out: Any,
                   options: dict[str, Any]) -> None:
    out.put(consumer(url, count, ready, options))


def run_workload(name: str, url: str, count: int, size: int) -> dict[str, Any]:
    """One run: {"msg_s", "received", "lost"}."""
    _, producer, consumer, options = WORKLOADS[name]
    context = mp.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    child = context.Process(target=_consumer_main, args=(consumer, url, count, ready, out, options), daemon=True)
    child.start()
    start = producer(url, count, size, ready, options)
    received, last = out.get(timeout=600)
    child.join(10)
    elapsed = last - start
    return {"msg_s": round(received / elapsed, 1) if received and elapsed > 0 else 0.0, "received": received,
            "lost": count - received}


def client_stack() -> dict[str, str]:
    """The peers' client libraries as this run has them: a result says what drove it."""
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"
    from redis.utils import HIREDIS_AVAILABLE

    return {"redis": f"redis-py {version('redis')}, hiredis {version('hiredis')}"
                     f" ({'used' if HIREDIS_AVAILABLE else 'NOT used: pure-Python parser'})",
            "nats": f"nats-py {version('nats-py')}, uvloop {version('uvloop')}",
            "mosquitto": f"paho-mqtt {version('paho-mqtt')}", "rabbitmq": f"aio-pika {version('aio-pika')}"}
