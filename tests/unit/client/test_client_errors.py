"""Errors reach the user as the one error tree: each wire code as its class with its
`retriable` flag, retriable ones retried first, bad arguments as InvalidArgument."""

from __future__ import annotations

import pytest

import danube_zmq
from danube_zmq.client.errors import AlreadyClosed, ProducerQueueFull
from danube_zmq.transport.client_protocol import GetPartitions, Subscribe
from danube_zmq.transport.errors import (
    DanubeError,
    ErrorCode,
    InternalError,
    InvalidArgument,
    Unavailable,
    error_from_code,
)
from tests.unit.client.test_client_fake_broker import client_for, running_broker

TOPIC = "/default/errs"


@pytest.mark.asyncio
@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
async def test_wire_error_codes_map_to_classes(code: ErrorCode) -> None:
    """An Error(code) reply is raised as the class for that code, with its message,
    code and retriable flag (no retries here: operation_retries_max=0)."""
    expected = type(error_from_code(code, ""))
    async with running_broker() as broker, client_for(broker, operation_retries_max=0) as client:
        broker.fail_next(GetPartitions, code, f"boom {code.name}")
        with pytest.raises(DanubeError) as info:
            await client.get_partitions(TOPIC)
        assert type(info.value) is expected
        assert info.value.code == code
        assert str(info.value) == f"boom {code.name}"
        assert info.value.retriable == expected.retriable
        retriable_codes = {ErrorCode.UNAVAILABLE, ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.TIMEOUT}
        assert info.value.retriable == (code in retriable_codes)


@pytest.mark.asyncio
async def test_unknown_error_code_is_internal_error() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.fail_next(GetPartitions, 99, "from the future")  # type: ignore[arg-type]
        with pytest.raises(InternalError, match="unknown error code 99"):
            await client.subscribe(TOPIC, "sub")


@pytest.mark.asyncio
async def test_retriable_errors_are_retried_then_succeed() -> None:
    """UNAVAILABLE twice (not a session error), then the topic: subscribe succeeds after
    three GetPartitions."""
    async with running_broker() as broker, client_for(broker, operation_retries_max=2) as client:
        broker.create_topic(TOPIC)
        broker.fail_next(GetPartitions, ErrorCode.UNAVAILABLE, "topic loading", times=2)
        await client.subscribe(TOPIC, "sub")
        assert len(broker.of(GetPartitions)) == 3


@pytest.mark.asyncio
async def test_non_retriable_errors_are_not_retried() -> None:
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        broker.fail_next(Subscribe, ErrorCode.PERMISSION_DENIED, "exclusive subscription taken")
        with pytest.raises(danube_zmq.PermissionDenied, match="exclusive"):
            await client.subscribe(TOPIC, "sub", sub_type="exclusive")
        assert len(broker.of(Subscribe)) == 1


@pytest.mark.asyncio
async def test_redirect_url_is_kept_on_the_exception() -> None:
    async with running_broker() as broker, client_for(broker, operation_retries_max=0) as client:
        broker.fail_next(GetPartitions, ErrorCode.UNAVAILABLE, "elsewhere", redirect_url="tcp://10.0.0.2:6650")
        with pytest.raises(Unavailable) as info:
            await client.get_partitions(TOPIC)
        assert info.value.redirect_url == "tcp://10.0.0.2:6650"  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_bad_arguments_are_invalid_argument() -> None:
    """Arguments are checked before anything is sent, and raise InvalidArgument."""
    async with running_broker() as broker, client_for(broker) as client:
        broker.create_topic(TOPIC)
        for kwargs in (
            {"sub_type": "bogus"},
            {"initial_position": "middle"},
            {"receiver_queue_size": 0},
            {"key_filters": [""]},
        ):
            with pytest.raises(InvalidArgument):
                await client.subscribe(TOPIC, "sub", **kwargs)
        with pytest.raises(InvalidArgument):
            await client.create_producer(TOPIC, partitions=-1)
        with pytest.raises(InvalidArgument):
            await client.create_producer("", batch_messages_max=10)
        assert broker.of(GetPartitions) == []
    with pytest.raises(InvalidArgument):
        danube_zmq.DanubeClient("tcp://x:1", request_timeout_ms=0)


@pytest.mark.asyncio
async def test_closed_client_raises_already_closed() -> None:
    async with running_broker() as broker:
        client = client_for(broker)
        await client.start()
        await client.close()
        with pytest.raises(AlreadyClosed) as info:
            await client.create_producer(TOPIC)
        assert isinstance(info.value, danube_zmq.FailedPrecondition)


def test_public_api_is_exported_from_the_package() -> None:
    """`from danube_zmq import ...` gives the client, the enums and the whole error tree."""
    for name in ("DanubeClient", "SyncClient", "Producer", "Consumer", "Message", "MessageId",
                 "SubType", "DispatchStrategy", "InitialPosition", "DanubeError", "Timeout",
                 "NotFound", "Unavailable", "ResourceExhausted", "ProducerQueueFull"):
        assert getattr(danube_zmq, name) is not None, name
    assert danube_zmq.ProducerQueueFull is ProducerQueueFull
    assert issubclass(danube_zmq.ProducerQueueFull, danube_zmq.ResourceExhausted)
    assert set(danube_zmq.__all__) <= set(dir(danube_zmq))
    with pytest.raises(AttributeError):
        _ = danube_zmq.NoSuchThing  # type: ignore[attr-defined]
