"""Who sent a request: a principal, a name and a type.

A principal comes from a token (`sub`, `principal_type`), from a client key on the
allow-list (the key's principal), or from a broker key (type `broker`). Rights are given
to principals (RBAC); a principal of type `broker` is only ever made from a broker key.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BROKER", "PRINCIPAL_TYPES", "Principal"]

PRINCIPAL_TYPES = ("user", "service_account", "broker")
BROKER = "broker"


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    type: str

    def __post_init__(self) -> None:
        assert self.type in PRINCIPAL_TYPES, self.type
