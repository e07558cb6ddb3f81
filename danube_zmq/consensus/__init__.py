"""Embedded Raft metadata store (see README.md): a pure Raft core, its deterministic
simulator, the metadata state machine, the durable log store, the peer (I/O shell over ZeroMQ)
and the async `MetadataStore` the broker moves onto next."""
