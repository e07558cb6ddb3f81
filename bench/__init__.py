"""`danube bench` (see bench/README.md): load generation and measurement like
pulsar-perf and Danube's load tester."""
