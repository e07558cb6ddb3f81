"""The chaos harness: faults on real processes (hosts, network, disk) and the checkers
that judge their histories. It may import any danube_zmq package; nothing in the
product imports it. See README.md."""
