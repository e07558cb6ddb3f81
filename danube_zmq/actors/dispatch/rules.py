"""The dispatch rule of each subscription type (the concrete rules import `rule.py`'s
shared types; this module imports them, so nothing imports back)."""

from __future__ import annotations

from danube_zmq.actors.dispatch.exclusive import ExclusiveRule
from danube_zmq.actors.dispatch.failover import FailoverRule
from danube_zmq.actors.dispatch.key_shared import KeySharedRule
from danube_zmq.actors.dispatch.rule import DispatchRule
from danube_zmq.actors.dispatch.shared import SharedRule
from danube_zmq.transport.client_protocol import SubType

__all__ = ["make_rule"]


def make_rule(sub_type: SubType) -> DispatchRule:
    """A fresh rule for a subscription of `sub_type`."""
    rules: dict[SubType, type[DispatchRule]] = {
        SubType.EXCLUSIVE: ExclusiveRule,
        SubType.SHARED: SharedRule,
        SubType.FAILOVER: FailoverRule,
        SubType.KEY_SHARED: KeySharedRule,
    }
    return rules[SubType(sub_type)]()
