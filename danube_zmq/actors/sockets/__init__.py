"""The broker's sockets: the client and admin gateways, their peers and budgets, the inbound watcher, /metrics."""
