"""Subscription dispatch rules: pure functions of (consumers, batch, permits) to assignments.

The subscription actor asks its rule which consumer gets which message of a
batch; the rule does no I/O and reads no clock. One module per subscription type:

    rule.py        shared types (SubType, Slice, Assignment, DispatchRule)
    rules.py       make_rule: the rule of each subscription type
    exclusive.py   one consumer gets everything
    failover.py    the earliest-attached consumer gets everything; the next is promoted
    shared.py      round-robin across consumers within their permits
    key_shared.py  consistent hashing of message keys, with optional glob key filters
"""

from .exclusive import ExclusiveRule
from .failover import FailoverRule
from .key_shared import KeySharedRule
from .rule import Assignment, DispatchRule, Slice, SubType
from .rules import make_rule
from .shared import SharedRule

__all__ = [
    "Assignment",
    "DispatchRule",
    "ExclusiveRule",
    "FailoverRule",
    "KeySharedRule",
    "SharedRule",
    "Slice",
    "SubType",
    "make_rule",
]
