"""GatewaySettings: every knob of one gateway process, built from CLI flags and validated at the edge."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from admission.controller import AdmissionSettings
from admission.queues import QueueBounds
from engine.config import EngineConfig


class GatewaySettings(BaseModel):
    """Where the gateway listens, what it stores where, and its admission and engine budgets."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    data_dir: Path = Path("./fairserve-data")
    db_url: str | None = None  # None: SQLite file in data_dir
    redis_url: str | None = None  # None: in-memory idempotency and quotas
    # Every Redis call's deadline; past it (or on a refused connection) the breaker opens and calls fail fast.
    redis_timeout_s: float = Field(default=0.25, gt=0, le=10)
    # Quotas while Redis is away: "open" admits (counted, X-Quota-Status header), "closed" answers 503.
    quota_on_redis_failure: Literal["open", "closed"] = "open"
    model: str | None = None  # None: the embedded default model
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    max_queued_requests: int = Field(default=256, ge=1)
    max_queued_tokens: int = Field(default=131072, ge=1)
    default_tenant_queued_requests: int = Field(default=64, ge=1)
    retry_jitter: float = Field(default=0.25, ge=0.0, le=1.0)
    idempotency_ttl_s: float = Field(default=86400.0, gt=0)
    # A run sent with an Idempotency-Key keeps going this long after its last reader disconnected, so
    # the client's retry attaches to it instead of generating again (0: abort at once, like unkeyed runs).
    # 10 s covers openai-python's back-off (at most 8 s) after a read timeout.
    idempotent_orphan_grace_s: float = Field(default=10.0, ge=0, le=600)
    grace_period_s: float = Field(default=10.0, ge=0)
    key_cache_ttl_s: float = Field(default=5.0, gt=0)
    # Authentication failures allowed per client address (gateway/auth_guard.py): a burst, then a rate.
    auth_failure_burst: int = Field(default=20, ge=1)
    auth_failure_rate_per_s: float = Field(default=2.0, gt=0)
    demo_tenant: str = "demo"  # created with a key on first start so the printed api_key works
    metrics_tenants: int = Field(default=50, ge=0)  # tenants given their own metric labels
    # /metrics on the main port needs the metrics (or admin) token. A metrics port, if set, serves the same
    # registry without a credential, so it listens on loopback unless told otherwise.
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    # The engine loop in its own process (ProcessEngine) rather than a thread sharing the gateway's GIL:
    # on by measurement (docs/gateway.md, "Benchmark: gateway overhead").
    engine_process: bool = True
    restart_engine: bool = True  # replace a dead engine worker (process engine only; gateway/engine_watch.py)
    # How often CPython makes a running thread offer the GIL to a waiting one. The ledger writer and other
    # helper threads run Python for milliseconds at a time; at CPython's 5 ms the event loop can wait that
    # long for every turn (bench/loop_lag.py measures both).
    switch_interval_ms: float = Field(default=0.5, gt=0, le=100)

    @field_validator("engine")
    @classmethod
    def _engine_valid(cls, value: EngineConfig) -> EngineConfig:
        value.validate()
        return value

    def admission_settings(self) -> AdmissionSettings:
        """The admission layer's view of these settings."""
        return AdmissionSettings(
            bounds=QueueBounds(
                max_queued_requests=self.max_queued_requests,
                max_queued_tokens=self.max_queued_tokens,
                default_tenant_queued_requests=self.default_tenant_queued_requests,
            ),
            retry_jitter=self.retry_jitter,
            fair_policy=self.engine.fairness.policy != "fcfs",
        )
