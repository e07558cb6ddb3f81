"""Moving a reliable topic between brokers in storage.mode local: both sides of a hand-over."""
