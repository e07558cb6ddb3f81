"""The danube-zmq client: asyncio-first (`DanubeClient`), with a blocking facade
(`SyncClient`). See README.md in this folder for the layout and the data paths."""

from danube_zmq.client.client import ClientStatistics, DanubeClient
from danube_zmq.client.consumer import Consumer, ConsumerStatistics
from danube_zmq.client.errors import AlreadyClosed, ConnectionLost, ProducerQueueFull
from danube_zmq.client.message import BatchReceipt, Message, MessageId
from danube_zmq.client.producer import BatchCallback, PendingSend, Producer, ProducerStatistics, SendCallback
from danube_zmq.client.sync import SyncClient, SyncConsumer, SyncProducer
from danube_zmq.transport.client_protocol import DispatchStrategy, InitialPosition, SubType

__all__ = [
    "AlreadyClosed",
    "BatchCallback",
    "BatchReceipt",
    "ClientStatistics",
    "ConnectionLost",
    "Consumer",
    "ConsumerStatistics",
    "DanubeClient",
    "DispatchStrategy",
    "InitialPosition",
    "Message",
    "MessageId",
    "PendingSend",
    "Producer",
    "ProducerQueueFull",
    "ProducerStatistics",
    "SendCallback",
    "SubType",
    "SyncClient",
    "SyncConsumer",
    "SyncProducer",
]
