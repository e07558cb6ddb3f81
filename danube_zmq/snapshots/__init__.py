"""WAL snapshots (see snapshots/README.md): manifests, Parquet exports of reliable
topics' records, and the snapshot location they live in."""
