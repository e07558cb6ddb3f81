"""A producer outlives its topic's owner going silent: while the producer is open the
client keeps re-creating it (capped backoff) however long the owner does not answer,
sends meanwhile fail only by their own timeout, and once the owner answers again sends
are acknowledged and every acknowledged message is consumed (issue 22, scenario B4)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import pytest

from danube_zmq import DanubeClient
from danube_zmq.client.admin import AdminClient
from danube_zmq.client.errors import ProducerQueueFull
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.errors import DanubeError
from tests.integration.actors.test_cluster import running_cluster

pytestmark = pytest.mark.cluster

# Each re-creation try waits the request timeout; the owner stays silent for several
# times what `operation_retries_max` retries take, so a client that counts them gives up.
REQUEST_TIMEOUT_MS = 1000
RETRIES_MAX = 1
SILENT_S = 10.0
RECOVERY_S_MAX = 90.0


def test_a_producer_keeps_re_creating_while_its_owner_is_silent(tmp_path: Path) -> None:
    """SIGSTOP the owner of a reliable topic for 10 s under a producer connected to
    another broker (1 retry of 1 s each: it would give up in ~3 s): `send_nowait` never
    raises anything but queue-full, a send after SIGCONT is acknowledged, and a consumer
    from the earliest offset receives every acknowledged message."""
    topic = "/default/outlast"

    async def run(nodes: list) -> None:  # type: ignore[type-arg]
        async with AdminClient(nodes[0].admin_url) as admin:
            await admin.create_topic(topic, dispatch_strategy=DispatchStrategy.RELIABLE)
        async with DanubeClient(nodes[0].url) as looking:
            owner_url = await looking.lookup(topic)
        owner = next(node for node in nodes if node.url == owner_url)
        other = next(node for node in nodes if node.url != owner_url)
        acked: dict[bytes, int] = {}
        raised: list[BaseException] = []
        resumed_at: list[float] = []
        async with DanubeClient(other.url, request_timeout_ms=REQUEST_TIMEOUT_MS,
                                operation_retries_max=RETRIES_MAX) as client:
            producer = await client.create_producer(topic, name="outlaster", dispatch="reliable")
            stop = asyncio.Event()

            async def produce() -> None:
                pending = []
                i = 0
                while not stop.is_set():
                    payload = f"m{i}".encode()
                    try:
                        pending.append((payload, producer.send_nowait(payload)))
                        i += 1
                    except ProducerQueueFull:
                        pass
                    except DanubeError as exc:  # the producer as a whole gave up
                        raised.append(exc)
                        return
                    still = []
                    for sent, handle in pending:
                        if handle.done():
                            with contextlib.suppress(DanubeError):  # failed by its own timeout: not acknowledged
                                acked[sent] = (await handle).offset
                        else:
                            still.append((sent, handle))
                    pending = still
                    await asyncio.sleep(0.02)
                for sent, handle in pending:
                    with contextlib.suppress(DanubeError):  # failed by its own timeout: not acknowledged
                        acked[sent] = (await handle).offset

            producing = asyncio.get_running_loop().create_task(produce())
            await _until(lambda: len(acked) >= 20 or bool(raised), "first acknowledgements", 30.0)
            assert owner.process is not None
            owner.process.process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(SILENT_S)
                acked_while_silent = len(acked)
            finally:
                owner.process.process.send_signal(signal.SIGCONT)
            continued = time.monotonic()
            await _until(lambda: len(acked) > acked_while_silent + 20 or bool(raised), "acks after SIGCONT",
                         RECOVERY_S_MAX)
            resumed_at.append(time.monotonic() - continued)
            stop.set()
            await producing
            assert not raised, f"the producer gave up: {raised[0]!r}"
            await producer.close()

        async with DanubeClient(other.url) as reading:
            consumer = await reading.subscribe(topic, "audit", initial_position="earliest")
            got: set[bytes] = set()
            deadline = time.monotonic() + 60
            while not set(acked) <= got:
                assert time.monotonic() < deadline, f"{len(set(acked) - got)} acknowledged messages not consumed"
                message = await consumer.receive(timeout=30)
                await consumer.ack(message)
                got.add(message.payload)
        print(f"{len(acked)} acknowledged, all consumed; first acks {resumed_at[0]:.2f} s after SIGCONT")

    with running_cluster(tmp_path) as nodes:
        asyncio.run(run(nodes))


async def _until(check, what: str, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
