"""Exceptions the fairness layer raises for bad input; all are ValueErrors with a message naming the field."""

from __future__ import annotations


class FairnessError(ValueError):
    """Base class: a caller handed a policy something it cannot schedule or charge."""


class DuplicateItemError(FairnessError):
    """An item whose request_id is already queued in this policy."""


class InvalidWeightError(FairnessError):
    """A fairness weight that is not a positive finite number."""


class InvalidChargeError(FairnessError):
    """A token count that is negative or not an integer, or a cost weight that is negative."""
