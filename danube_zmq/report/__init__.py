"""Spark over WAL snapshots (see report/README.md): the `danube` data source and
`danube report backlog`."""
