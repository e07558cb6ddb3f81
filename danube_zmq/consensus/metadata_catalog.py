"""The segment catalog's store on a broker: the Raft metadata store.

Reads come from this broker's applied state, with no Raft round: a write through Raft
returns only once this peer has applied it, so a broker always reads its own writes,
and descriptors written by a topic's previous owner arrive with the replicated log.
"""

from __future__ import annotations

from danube_zmq.consensus.metadata_store import RaftMetadataStore


class MetadataCatalog:
    def __init__(self, metadata: RaftMetadataStore) -> None:
        self.metadata = metadata

    def get(self, key: str) -> bytes | None:
        value = self.metadata.local_get(key)
        return None if value is None else value.value

    def scan(self, prefix: str) -> list[tuple[str, bytes]]:
        return [(key, value.value) for key, value in self.metadata.local_scan(prefix)]

    async def put_async(self, key: str, value: bytes) -> None:
        await self.metadata.put(key, value)

    async def delete_async(self, key: str) -> None:
        await self.metadata.delete(key)
