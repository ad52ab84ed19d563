"""Scheduling policies over fairness keys: who is admitted next, who is charged, who is preempted."""

from fairness.base import Item, ItemMeta, SchedulingPolicy
from fairness.config import FairnessConfig, make_policy
from fairness.cost import TokenCost
from fairness.edf import EDFPolicy
from fairness.errors import (
    DuplicateItemError,
    FairnessError,
    InvalidChargeError,
    InvalidWeightError,
)
from fairness.fcfs import FCFSPolicy
from fairness.keys import KEY_FUNCTIONS, api_key_key, key_function, tenant_key, user_key
from fairness.priority import PriorityPolicy
from fairness.registry import DEFAULT_POLICY, POLICIES, PolicyEntry, policy_entry
from fairness.vtc import VTCPolicy

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "PolicyEntry",
    "policy_entry",
    "KEY_FUNCTIONS",
    "DuplicateItemError",
    "EDFPolicy",
    "FCFSPolicy",
    "FairnessConfig",
    "FairnessError",
    "InvalidChargeError",
    "InvalidWeightError",
    "Item",
    "ItemMeta",
    "PriorityPolicy",
    "SchedulingPolicy",
    "TokenCost",
    "VTCPolicy",
    "api_key_key",
    "key_function",
    "make_policy",
    "tenant_key",
    "user_key",
]
