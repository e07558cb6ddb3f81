"""The `danube` command line: broker, produce/consume, admin, bench, cluster and report commands (see README.md)."""
