"""The actor runtime: actors, the actor system, mailboxes and supervision (see README.md)."""
