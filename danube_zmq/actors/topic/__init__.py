"""The topic actor: one shell (`shell.py`) with a storage side (`memory_tail.py` or
`wal/`, the interface both ways in `storage.py`, the shell's side of it in `port.py`),
made by `factory.make_topic`."""

from danube_zmq.actors.topic.factory import make_topic
from danube_zmq.actors.topic.memory_tail import MemoryTail
from danube_zmq.actors.topic.shell import TopicActor
from danube_zmq.actors.topic.wal import WalStorage

__all__ = ["MemoryTail", "TopicActor", "WalStorage", "make_topic"]
