"""FairnessConfig, validated at the edge, and `make_policy`, which composes the configured policy."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fairness.cost import TokenCost
from fairness.edf import EDFPolicy
from fairness.fcfs import FCFSPolicy
from fairness.keys import key_function
from fairness.priority import PriorityPolicy
from fairness.vtc import VTCPolicy


class FairnessConfig(BaseModel):
    """Which policy orders the waiting queue and its knobs; the field names match engine FairnessSettings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["fcfs", "vtc"] = "vtc"
    key: Literal["tenant", "api_key", "user"] = "tenant"
    w_in: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    w_out: float = Field(default=2.0, ge=0, allow_inf_nan=False)
    w_cached: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    priority_classes: bool = True
    max_queue_age_s: float = Field(default=30.0, gt=0, description="aging period; inf disables promotion")
    edf: bool = False
    # Service a key that becomes backlogged may keep below the backlogged minimum (fairness/vtc.py): the
    # most credit any key can bank. 0 is the paper's lift; 1024 is one 512-token answer at w_out=2.
    lift_allowance: float = Field(default=1024.0, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _counters_can_grow(self) -> FairnessConfig:
        if self.w_in == 0 and self.w_out == 0:
            raise ValueError("w_in and w_out cannot both be 0: fairness counters would never grow")
        if math.isnan(self.max_queue_age_s):
            raise ValueError("max_queue_age_s must be a number")
        return self

    @classmethod
    def from_settings(cls, settings: Any) -> FairnessConfig:
        """Validate any object with the same attribute names (e.g. engine.config.FairnessSettings)."""
        return cls.model_validate(settings, from_attributes=True)

    def token_cost(self) -> TokenCost:
        """The cost function these weights define."""
        return TokenCost(self.w_in, self.w_out, self.w_cached)


def make_policy(config: FairnessConfig | None = None) -> Any:
    """Build the policy `config` describes: base (fcfs|vtc), optionally under EDF, optionally per priority class.

    The result satisfies `fairness.base.SchedulingPolicy` and also offers `set_weight`, `counters`,
    `victim(running, for_item)` and `__contains__`.
    """
    config = config or FairnessConfig()
    cost = config.token_cost()
    key_fn = key_function(config.key)

    def make_base() -> Any:
        base: Any = VTCPolicy(cost, key_fn, config.lift_allowance) if config.policy == "vtc" else FCFSPolicy(cost, key_fn)
        return EDFPolicy(base) if config.edf else base

    if config.priority_classes:
        return PriorityPolicy(make_base, config.max_queue_age_s)
    return make_base()
