"""The chaos harness (issue 22): hosts in network namespaces, faults on real processes
(network, process, disk), the client workload that records histories, and the
Jepsen-style checkers that judge them. See README.md.

Nothing in the product imports this package; it may import any of the product's."""
