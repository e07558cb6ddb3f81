"""The subscription actor: one shell (`shell.py`) with a delivery side
(`rule_delivery.py` or `tracked_delivery.py`, the interface in `delivery.py`)."""

from danube_zmq.actors.subscription.delivery import Consumer, Delivery
from danube_zmq.actors.subscription.rule_delivery import RuleDelivery
from danube_zmq.actors.subscription.shell import SubscriptionActor
from danube_zmq.actors.subscription.tracked_delivery import TrackedDelivery

__all__ = ["Consumer", "Delivery", "RuleDelivery", "SubscriptionActor", "TrackedDelivery"]
