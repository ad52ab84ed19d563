"""Lower-level objects built with the settings tree's defaults, for tests that do not care about a knob.

The tree (gateway/settings.py and the configs it nests) is the one place a default is written; the
dataclasses below it take every knob as a required argument, so a test reads the defaults from here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from admission.controller import AdmissionSettings
from admission.feasibility import RatePriors
from admission.queues import QueueBounds
from engine.core.scheduler_output import SchedulerConfig
from engine.serving.remote.liveness import SilenceBounds
from fairness.config import FairnessConfig
from fairness.cost import TokenCost
from fairness.fcfs import FCFSPolicy
from fairness.flows import FlowVTCPolicy
from fairness.keys import KeyFn
from fairness.vtc import VTCPolicy
from gateway.engine_server_settings import EngineServerSettings
from gateway.settings import GatewaySettings

FAIRNESS = FairnessConfig()
COST: TokenCost = FAIRNESS.token_cost()
LIFT: float = FAIRNESS.lift_allowance
MAX_QUEUE_AGE_S: float = FAIRNESS.max_queue_age_s
PRIORS: RatePriors = GatewaySettings().admission_settings().priors
REDIS_TIMEOUT_S: float = GatewaySettings.model_fields["redis_timeout_s"].default
HEARTBEAT_TIMEOUT_S: float = GatewaySettings.model_fields["engine_heartbeat_timeout_s"].default
SILENCE: SilenceBounds = GatewaySettings().engine_silence()
GATEWAY_TIMEOUT_S: float = EngineServerSettings.model_fields["gateway_timeout_s"].default
GRACE_PERIOD_S: float = EngineServerSettings.model_fields["grace_period_s"].default


def vtc(cost: TokenCost = COST, lift_allowance: float = LIFT) -> VTCPolicy[Any]:
    """A VTC policy with the tree's cost and lift allowance unless told otherwise."""
    return VTCPolicy(cost, lift_allowance=lift_allowance)


def flow_vtc(
    flow_fn: KeyFn,
    cost: TokenCost = COST,
    lift_allowance: float = LIFT,
    max_flows_per_tenant: int = FAIRNESS.max_flows_per_tenant,
) -> FlowVTCPolicy[Any]:
    """A two-level VTC over `flow_fn` with the tree's knobs unless told otherwise."""
    return FlowVTCPolicy(
        cost, flow_fn, lift_allowance=lift_allowance, max_flows_per_tenant=max_flows_per_tenant
    )


def fcfs() -> FCFSPolicy[Any]:
    """An FCFS policy charging the tree's cost."""
    return FCFSPolicy(COST)


def scheduler_config(**overrides: Any) -> SchedulerConfig:
    """The scheduler budgets of a default EngineConfig (max_model_len 2048 unless told)."""
    engine = GatewaySettings.model_fields["engine"].get_default(call_default_factory=True)
    base = SchedulerConfig(
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_num_seqs=engine.max_num_seqs,
        max_model_len=2048,
        watermark_blocks=engine.watermark_blocks,
        preemption_mode=engine.preemption_mode,
    )
    return dataclasses.replace(base, **overrides)


def admission_settings(retry_jitter: float | None = None, **bounds: int) -> AdmissionSettings:
    """The tree's admission settings with some queue bounds (and the jitter) replaced."""
    settings = GatewaySettings().admission_settings()
    settings.bounds = dataclasses.replace(settings.bounds, **bounds)
    if retry_jitter is not None:
        settings.retry_jitter = retry_jitter
    return settings


def queue_bounds(**bounds: int) -> QueueBounds:
    """The tree's queue bounds with some replaced."""
    return admission_settings(**bounds).bounds
