"""The schema registry's actor side: client-port answers, admin, produce-time checks."""
