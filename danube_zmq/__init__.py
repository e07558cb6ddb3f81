"""danube-zmq: Danube Messaging rebuilt in Python as ZeroMQ actors.

The public client API is importable from here:

    from danube_zmq import DanubeClient, SubType

Names are loaded on first use (PEP 562), so importing a broker module does not import
the client and its dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "DanubeClient": "danube_zmq.client.client",
    "SyncClient": "danube_zmq.client.sync",
    "SyncProducer": "danube_zmq.client.sync",
    "SyncConsumer": "danube_zmq.client.sync",
    "Producer": "danube_zmq.client.producer",
    "Consumer": "danube_zmq.client.consumer",
    "Reader": "danube_zmq.client.reader",
    "SyncReader": "danube_zmq.client.sync",
    "Message": "danube_zmq.client.message",
    "MessageId": "danube_zmq.client.message",
    "BatchReceipt": "danube_zmq.client.message",
    "SubType": "danube_zmq.transport.client_protocol",
    "DispatchStrategy": "danube_zmq.transport.client_protocol",
    "InitialPosition": "danube_zmq.transport.client_protocol",
    "ErrorCode": "danube_zmq.transport.errors",
    "DanubeError": "danube_zmq.transport.errors",
    "InvalidArgument": "danube_zmq.transport.errors",
    "NotFound": "danube_zmq.transport.errors",
    "AlreadyExists": "danube_zmq.transport.errors",
    "PermissionDenied": "danube_zmq.transport.errors",
    "ProducerBusy": "danube_zmq.transport.errors",
    "ConsumerBusy": "danube_zmq.transport.errors",
    "ResourceExhausted": "danube_zmq.transport.errors",
    "Unavailable": "danube_zmq.transport.errors",
    "FailedPrecondition": "danube_zmq.transport.errors",
    "InternalError": "danube_zmq.transport.errors",
    "UnsupportedVersion": "danube_zmq.transport.errors",
    "Timeout": "danube_zmq.transport.errors",
    "ConfigError": "danube_zmq.transport.errors",
    "ProducerQueueFull": "danube_zmq.client.errors",
    "ConnectionLost": "danube_zmq.client.errors",
    "AlreadyClosed": "danube_zmq.client.errors",
}

__all__ = [
    "AlreadyClosed",
    "AlreadyExists",
    "BatchReceipt",
    "ConfigError",
    "ConnectionLost",
    "Consumer",
    "ConsumerBusy",
    "DanubeClient",
    "DanubeError",
    "DispatchStrategy",
    "ErrorCode",
    "FailedPrecondition",
    "InitialPosition",
    "InternalError",
    "InvalidArgument",
    "Message",
    "MessageId",
    "NotFound",
    "PermissionDenied",
    "Producer",
    "ProducerBusy",
    "ProducerQueueFull",
    "Reader",
    "ResourceExhausted",
    "SubType",
    "SyncClient",
    "SyncConsumer",
    "SyncProducer",
    "SyncReader",
    "Timeout",
    "Unavailable",
    "UnsupportedVersion",
]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'danube_zmq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from danube_zmq.client.client import DanubeClient
    from danube_zmq.client.consumer import Consumer
    from danube_zmq.client.errors import AlreadyClosed, ConnectionLost, ProducerQueueFull
    from danube_zmq.client.message import BatchReceipt, Message, MessageId
    from danube_zmq.client.producer import Producer
    from danube_zmq.client.reader import Reader
    from danube_zmq.client.sync import SyncClient, SyncConsumer, SyncProducer, SyncReader
    from danube_zmq.transport.client_protocol import DispatchStrategy, InitialPosition, SubType
    from danube_zmq.transport.errors import (
        AlreadyExists,
        ConfigError,
        ConsumerBusy,
        DanubeError,
        ErrorCode,
        FailedPrecondition,
        InternalError,
        InvalidArgument,
        NotFound,
        PermissionDenied,
        ProducerBusy,
        ResourceExhausted,
        Timeout,
        Unavailable,
        UnsupportedVersion,
    )
