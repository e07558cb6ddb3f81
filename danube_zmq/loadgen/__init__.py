"""`danube bench` (see loadgen/README.md): load generation and measurement like
pulsar-perf and Danube's load tester."""
