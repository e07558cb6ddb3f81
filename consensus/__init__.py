"""Embedded Raft metadata store. Empty until the Raft issue lands; a standalone
broker keeps its registry in the broker actor's memory until then."""
