"""Storage engine for reliable topics: WAL, durable segments, tiered reader.

Empty until the reliable-dispatch issue lands; non-reliable topics keep nothing here.
"""
