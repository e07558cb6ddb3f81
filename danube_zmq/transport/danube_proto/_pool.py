"""The descriptor pool of the vendored Danube protos, apart from protobuf's default pool.

Why: `danube-client` (PyPI) registers the same `danube.*` message names in the default
pool from its own copy of `DanubeApi.proto`; a process importing both (a test, an
application moving from one client to the other) would otherwise fail with "duplicate
symbol". The wire format does not depend on the pool.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
