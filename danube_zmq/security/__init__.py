"""Who may reach a broker and what they may do: CURVE keys, JWT tokens, RBAC.

A lower layer: it imports `transport/` only, and `actors/`, `client/` and `cli/` import it.
"""
