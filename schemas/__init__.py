"""Schema registry. Empty until the schema-registry issue lands; messages already
carry schema id and version slots on the wire."""
