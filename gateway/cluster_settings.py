"""ClusterConfig: the `ray` node of the settings tree, the knobs of `fairserve ray up/scale` (flags
`--engines`, ...; env FAIRSERVE_RAY__<NAME>).

The gateway's and engine's own knobs stay in GatewaySettings: `ray up` takes every `serve` flag as well
and hands the engine part to the engine actors and the whole tree to the gateway actors. It sits in
gateway/ because cluster/ sits above every other package: `fairserve config show` lists it from here.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "FAIRSERVE_RAY__"


class ClusterConfig(BaseSettings):
    """Where the Ray cluster is, how many engines and gateways run on it, and what each reserves."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_assignment=True)

    address: str | None = Field(
        default=None,
        description="Ray cluster to join (host:port or auto); "
        "default: start a local one, which lives as long as `ray up` runs",
    )
    namespace: str = Field(
        default="fairserve",
        description="Ray namespace of the registry, engines and gateways (one deployment per namespace)",
    )
    engines: int = Field(default=1, ge=0, le=1024, description="engine actors (one GPU each on CUDA)")
    gateways: int = Field(default=1, ge=1, le=256, description="gateway actors (uvicorn replicas)")
    engine_cpus: float = Field(
        default=1.0, gt=0, description="CPUs Ray reserves per engine actor on a CPU device"
    )
    gateway_cpus: float = Field(default=1.0, ge=0, description="CPUs Ray reserves per gateway actor")
    max_restarts: int = Field(
        default=-1, ge=-1, description="times Ray restarts a dead engine or gateway actor (-1: always)"
    )
    engine_host: str | None = Field(
        default=None, description="address engines listen on (default: their node's IP as Ray reports it)"
    )
    num_cpus: int | None = Field(
        default=None, ge=1, description="CPUs of the local cluster `ray up` starts (default: Ray counts them)"
    )
    poll_interval_s: float = Field(
        default=0.5,
        gt=0,
        le=10,
        description="how often gateways re-read the registry for engines that joined, left or restarted",
    )
    ping_timeout_s: float = Field(
        default=2.0,
        gt=0,
        le=30,
        description="an engine actor that does not answer "
        "the registry's ping within this long leaves the registry",
    )
    drain_timeout_s: float = Field(
        default=120.0,
        ge=0,
        description="scale-down waits this long for a removed engine's requests to finish before killing it",
    )
    ready_timeout_s: float = Field(
        default=600.0, gt=0, description="how long `ray up` waits for the first gateway to answer"
    )
