"""The chaos harness (issue 22): namespace hosts, a cluster across them, faults,
histories and checkers. Nothing in the product imports it."""
