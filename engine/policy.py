"""Builds the fairness policy the scheduler consults, from the engine's FairnessConfig."""

from __future__ import annotations

from engine.request import Request
from fairness import FairnessConfig, make_policy
from fairness.base import SchedulingPolicy


def build_policy(config: FairnessConfig) -> SchedulingPolicy[Request]:
    """The configured policy (a registered base, optionally under priority classes and EDF)."""
    policy: SchedulingPolicy[Request] = make_policy(config)
    return policy
