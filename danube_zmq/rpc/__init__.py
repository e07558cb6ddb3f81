"""One request/reply session with a broker port: a DEALER, its Connect, the token it carries."""
