"""The load manager's pure core: broker load from reports, placement of new topics and
rebalancing decisions, with no I/O and no clock (the actor around it passes the time).

    reports.py     LoadReport, TopicLoad, BrokerState; a topic's and a broker's load
    placement.py   Strategy (fair, balanced, weighted_load), scores, place
    rebalance.py   RebalancePolicy and its levels, measure (CV), plan, drain
"""

from .placement import Placement, Strategy, place, scores
from .rebalance import Aggressiveness, Balance, Move, Plan, RebalancePolicy, drain, measure, plan
from .reports import BrokerState, LoadReport, TopicLoad, broker_loads, topic_loads

__all__ = [
    "Aggressiveness",
    "Balance",
    "BrokerState",
    "LoadReport",
    "Move",
    "Placement",
    "Plan",
    "RebalancePolicy",
    "Strategy",
    "TopicLoad",
    "broker_loads",
    "drain",
    "measure",
    "place",
    "plan",
    "scores",
    "topic_loads",
]
