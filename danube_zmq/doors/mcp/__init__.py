"""The MCP server of `danube admin serve --mode mcp`: the admin operations as tools."""
