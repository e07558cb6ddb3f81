"""The Raft metadata store through the admin API: cluster status, versioned keys,
compare-and-swap, TTL leases.

Every broker runs a Raft peer of the metadata store (standalone: a single voter). This
example prints the broker's view of the metadata cluster, then writes a key, updates it
with a compare-and-swap on its version (and shows a stale CAS refused), puts a key with
a TTL lease, lists the keys under its prefix and deletes them.

    DANUBE_ADMIN_ENDPOINT=tcp://127.0.0.1:50051 python examples/metadata_store.py

The admin URL comes from $DANUBE_ADMIN_ENDPOINT, else tcp://127.0.0.1:50051.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from danube_zmq.client.admin import AdminClient

ADMIN_URL = os.environ.get("DANUBE_ADMIN_ENDPOINT", "tcp://127.0.0.1:50051")
PREFIX = f"/examples/{uuid.uuid4().hex[:8]}/"  # unique, so reruns never collide


class ExampleFailed(Exception):
    """What the example expected did not happen."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ExampleFailed(message)


async def main() -> None:
    async with AdminClient(ADMIN_URL) as admin:
        status = await admin.cluster_status()
        voters = [m.node_id for m in status.members if m.voter]
        print(f"node {status.node_id} is {status.role.lower()} in term {status.term}; voters {voters}")
        check(status.leader_id is not None, "the metadata cluster has no leader")

        config_key = PREFIX + "config"
        first = await admin.metadata_put(config_key, b'{"retention": "1d"}')
        print(f"put {config_key}: version {first.version}, revision {first.mod_revision}")

        swapped = await admin.metadata_cas(config_key, first.version, b'{"retention": "7d"}')
        check(swapped.succeeded and swapped.entry is not None and swapped.entry.version == 2, "CAS should succeed")
        stale = await admin.metadata_cas(config_key, first.version, b'{"retention": "30d"}')
        check(not stale.succeeded, "a CAS on an old version must be refused")
        print(f"CAS at version {first.version}: applied once, refused the second time (now version 2)")

        lease_key = PREFIX + "lease"
        lease = await admin.metadata_put(lease_key, b"owner-a", ttl_ms=60_000)
        print(f"put {lease_key} with a {lease.ttl_ms} ms lease")

        listed = await admin.metadata_list(PREFIX)
        for entry in listed.entries:
            print(f"  {entry.key} = {entry.value.decode()} (version {entry.version})")
        check([e.key for e in listed.entries] == [config_key, lease_key], "both keys listed, in order")

        deleted = await admin.metadata_delete(PREFIX, prefix=True)
        check(deleted == 2, f"expected 2 keys deleted, got {deleted}")
        check(await admin.metadata_get(config_key) is None, "the key is gone")
        print(f"deleted {deleted} keys under {PREFIX}")


if __name__ == "__main__":
    asyncio.run(main())
