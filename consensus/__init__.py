"""Embedded Raft metadata store (see README.md): a pure Raft core, its deterministic
simulator, the metadata state machine, the durable log store, and (next) the peer actor
and the `MetadataStore` API the broker moves onto."""
