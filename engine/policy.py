"""Builds the fairness policy the scheduler consults, from the engine's FairnessSettings."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import fairness
from engine.config import FairnessSettings
from engine.request import Request
from fairness.base import SchedulingPolicy


def build_policy(settings: FairnessSettings) -> SchedulingPolicy[Request]:
    """The configured policy (fcfs or vtc, optionally under priority classes and EDF)."""
    make: Any = getattr(fairness, "make_policy", None)
    if make is None:
        fcfs: fairness.FCFSPolicy[Request] = fairness.FCFSPolicy(settings.w_in, settings.w_out, settings.w_cached)
        return fcfs
    config_type: Any = fairness.FairnessConfig  # type: ignore[attr-defined]
    policy: SchedulingPolicy[Request] = make(config_type(**asdict(settings)))
    return policy
