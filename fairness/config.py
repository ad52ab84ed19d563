"""FairnessConfig, validated at the edge, and `make_policy`, which composes the configured policy."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fairness.cost import TokenCost
from fairness.edf import EDFPolicy
from fairness.keys import key_function
from fairness.priority import PriorityPolicy
from fairness.registry import DEFAULT_POLICY, POLICIES, policy_entry

FairnessKey = Literal["tenant", "api_key", "user", "tenant/user", "tenant/workflow", "tenant/api_key"]
"""What fair share is kept per (`FairnessConfig.key`)."""


class FairnessConfig(BaseModel):
    """Which policy orders the waiting queue and its knobs: the engine's and the settings tree's one shape.

    Each field is one knob of `fairserve serve` (flag, FAIRSERVE_ENGINE__FAIRNESS__* variable, TOML key in
    [engine.fairness]); its description is the flag's help.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(default=DEFAULT_POLICY, description=f"fairness policy: {' | '.join(POLICIES)}")
    key: FairnessKey = Field(
        default="tenant",
        description="what fair share is kept per: tenant, API key or end user; tenant/<flow> keeps it "
        "among tenants, then among each tenant's users, workflow runs or API keys (vtc)",
    )
    w_in: float = Field(default=1.0, ge=0, allow_inf_nan=False, description="charge per prompt token")
    w_out: float = Field(default=2.0, ge=0, allow_inf_nan=False, description="charge per output token")
    w_cached: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="charge per cached prompt token"
    )
    priority_classes: bool = Field(default=True, description="serve tenants' priority classes in order")
    max_queue_age_s: float = Field(default=30.0, gt=0, description="aging period; inf disables promotion")
    edf: bool = Field(default=False, description="order each tenant's own requests by deadline")
    # The most credit any key can bank (fairness/vtc.py, docs/fairness.md "Lifting"): 0 is the paper's lift;
    # 1024 is one 512-token answer at w_out=2.
    lift_allowance: float = Field(
        default=1024.0,
        ge=0,
        allow_inf_nan=False,
        description="service a key that becomes backlogged may keep below the backlogged minimum (vtc)",
    )

    # vtc-locality's slack Δ (fairness/locality.py): 2048 is two 1,024-token prompts at w_in=1.
    locality_slack: float = Field(
        default=2048.0,
        ge=0,
        allow_inf_nan=False,
        description="vtc-locality: service a key may lead the least served one by and still be admitted for "
        "its cached prefix blocks; the fairness bound grows by it",
    )

    max_flows_per_tenant: int = Field(
        default=1024,
        ge=1,
        le=1 << 20,
        description="flows (users, workflow runs, API keys) a tenant/<flow> key, or keys a flat user/api_key "
        "key, remembers per tenant; beyond it idle ones are forgotten, then new ones count as the tenant",
    )

    @field_validator("policy")
    @classmethod
    def _registered(cls, value: str) -> str:
        policy_entry(value)  # ValueError naming the registered policies
        return value

    @model_validator(mode="after")
    def _counters_can_grow(self) -> FairnessConfig:
        if self.w_in == 0 and self.w_out == 0:
            raise ValueError("w_in and w_out cannot both be 0: fairness counters would never grow")
        if self.policy == "vtc-locality" and self.key != "tenant":
            # A client-chosen or two-level key needs the bounded state of fairness/bounded.py and flows.py.
            raise ValueError("policy vtc-locality keeps fair share per tenant only: use key tenant")
        if math.isnan(self.max_queue_age_s):
            raise ValueError("max_queue_age_s must be a number")
        return self

    def token_cost(self) -> TokenCost:
        """The cost function these weights define."""
        return TokenCost(self.w_in, self.w_out, self.w_cached)


def make_policy(
    config: FairnessConfig | None = None, cached_blocks: Callable[[Any], int] | None = None
) -> Any:
    """Build the policy `config` describes: a registered base, optionally under EDF, optionally per priority class.

    `cached_blocks` is the engine's probe of its KV pool, passed to a policy that ranks by locality.
    The result satisfies `fairness.base.SchedulingPolicy` and also offers `set_weight`, `counters`,
    `victim(running, for_item)` and `__contains__`.
    """
    config = config or FairnessConfig()
    cost = config.token_cost()
    key_fn = key_function(config.key)

    def make_base() -> Any:
        entry = POLICIES[config.policy]
        extra = {"cached_blocks": cached_blocks} if entry.uses_cached_blocks else {}
        base: Any = entry.build(cost, key_fn, **entry.configure(config), **extra)
        return EDFPolicy(base) if config.edf else base

    if config.priority_classes:
        return PriorityPolicy(make_base, config.max_queue_age_s)
    return make_base()
