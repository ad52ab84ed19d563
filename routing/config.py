"""RoutingSettings: the scorer's weights and the affinity memory, one field per knob.

Hung under `GatewaySettings.routing` (gateway/settings.py), so every field is also a `fairserve serve`
flag (its leaf name: `--affinity-weight`), a `FAIRSERVE_ROUTING__*` variable and a key of the
`[routing]` TOML table. Only a gateway with several engines routes; with one engine they are inert.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RoutingSettings(BaseModel):
    """How `EngineRouter` weighs prefix affinity against an engine's load (routing/score.py)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # The load terms are each about 1 when that resource of the engine is full, so an affinity weight of
    # 0.5 lets a prefix pull a request to an engine until that engine is half a batch of queue (or half
    # its KV cache) busier than the least loaded one: then load wins and the tenant spreads.
    affinity_weight: float = Field(
        default=0.5,
        ge=0,
        allow_inf_nan=False,
        description="score of an engine that already holds a prompt's first affinity_blocks blocks "
        "(0: route by load alone)",
    )
    affinity_blocks: int = Field(
        default=8,
        ge=1,
        le=256,
        description="leading full KV blocks of a prompt whose digests key its affinity",
    )
    affinity_entries: int = Field(
        default=8192,
        ge=1,
        le=1 << 22,
        description="block digests remembered per engine (least recently routed forgotten first)",
    )
    queue_weight: float = Field(
        default=1.0,
        ge=0,
        allow_inf_nan=False,
        description="load of an engine's waiting requests, per batch of them (waiting / max_num_seqs)",
    )
    waiting_token_weight: float = Field(
        default=1.0,
        ge=0,
        allow_inf_nan=False,
        description="load of an engine's waiting prompt tokens, per KV cache of them",
    )
    running_weight: float = Field(
        default=0.5,
        ge=0,
        allow_inf_nan=False,
        description="load of an engine's running requests, per batch of them (running / max_num_seqs)",
    )
    tenant_spread_weight: float = Field(
        default=0.5,
        ge=0,
        allow_inf_nan=False,
        description="pull of a tenant's requests away from an engine already running its others, per batch "
        "of them (keeps each tenant on every engine, so per-engine fair share is the global one)",
    )
    kv_weight: float = Field(
        default=0.5, ge=0, allow_inf_nan=False, description="load of an engine's KV cache when it is full"
    )
