"""The broker in its cluster: lease, ownership, metadata watches, calls to peers."""
