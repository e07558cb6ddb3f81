"""The broker's actors and the runtime they run on (see README.md)."""
