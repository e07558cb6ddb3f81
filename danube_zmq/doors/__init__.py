"""The front doors: servers beside the broker that speak other protocols to its ports (gRPC, the web console, MCP)."""
