"""The broker actor and the helpers and children that answer for the topics it serves."""
