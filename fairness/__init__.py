"""Scheduling policies over tenants: who is admitted next, who is charged, who is preempted."""

from fairness.base import Item, ItemMeta, SchedulingPolicy
from fairness.fcfs import FCFSPolicy

__all__ = ["FCFSPolicy", "Item", "ItemMeta", "SchedulingPolicy"]
