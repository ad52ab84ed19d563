"""Builds the fairness policy the scheduler consults, from the engine's FairnessSettings."""

from __future__ import annotations

from dataclasses import asdict

from engine.config import FairnessSettings
from engine.request import Request
from fairness import FairnessConfig, make_policy
from fairness.base import SchedulingPolicy


def build_policy(settings: FairnessSettings) -> SchedulingPolicy[Request]:
    """The configured policy (fcfs or vtc, optionally under priority classes and EDF)."""
    policy: SchedulingPolicy[Request] = make_policy(FairnessConfig(**asdict(settings)))
    return policy
