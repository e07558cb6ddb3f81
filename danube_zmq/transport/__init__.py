"""The wire protocol, declared once: codec, message types per boundary, errors."""
