"""The broker's actors, on the runtime of `danube_zmq.runtime` (see README.md)."""
