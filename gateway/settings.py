"""GatewaySettings: the one typed settings tree of a gateway process (pydantic-settings).

Every knob is one field with its default and description, here or in a node of the tree
(`engine.EngineConfig`, `fairness.FairnessConfig`, `routing.RoutingSettings`, `billing.LedgerConfig`,
`upstream.UpstreamSettings`;
`fairserve ray`'s `ClusterConfig` in gateway/cluster_settings.py), and nowhere else: the layers below
take it as a required argument (tests/gateway/test_one_default.py). From that field alone it gets its
flag (gateway/settings_flags.py), its `FAIRSERVE_*` environment variable (nested with `__`, e.g.
`FAIRSERVE_ENGINE__MAX_NUM_SEQS`) and its key in an optional TOML file (`--config`; tables `[engine]`,
`[engine.fairness]`, `[ledger]`, `[routing]` and `[upstream]`). Precedence: flag, then environment, then file, then
the default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    EnvSettingsSource,
    TomlConfigSettingsSource,
)

from admission.backoff import RETRY_AFTER_CAP_S
from admission.controller import AdmissionSettings
from admission.feasibility import RatePriors
from admission.queues import QueueBounds
from billing import LedgerConfig
from engine.config import EngineConfig
from engine.serving.remote.address import check_address
from engine.serving.remote.curve import ClusterKey
from engine.serving.remote.liveness import SilenceBounds
from fairness import policy_entry
from gateway.model_settings import ModelSettings, one_local_model
from gateway.settings_base import DataDirSettings, StorageSettings
from routing.config import RoutingSettings
from upstream.config import UpstreamSettings

MAX_JSON_DEPTH = 64  # the default of GatewaySettings.max_json_depth (parse_body's too)


class ProcessSettings(DataDirSettings):
    """What `serve` and `fairserve engine` share: the engine tree, the cluster key, shutdown and the GIL."""

    # engine/serving/remote/curve.py: CURVE encryption between gateways and engines. `serve --engine` reads the
    # file (refused before anything starts when bad); `fairserve engine` creates it 0600 when missing.
    cluster_key_file: Path | None = Field(
        default=None,
        description="a key file shared by the engines and their gateways: the link is "
        "encrypted and peers without it are refused",
        json_schema_extra={"flags": ["--cluster-key"]},
    )
    grace_period_s: float = Field(
        default=10.0,
        ge=0,
        description="seconds live requests get to finish on SIGTERM",
        json_schema_extra={"flags": ["--grace-period"]},
    )
    # How often CPython makes a running thread offer the GIL to a waiting one. The ledger writer, the socket
    # thread and other helpers run Python for milliseconds at a time; at CPython's 5 ms the event loop or the
    # engine loop can wait that long for every turn (docs/gateway.md, loop lag).
    switch_interval_ms: float = Field(default=0.5, gt=0, le=100, description="CPython's GIL switch interval")
    # Logs to operate by (gateway/ops/logs.py): to stderr, one line per record, as text or JSON.
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="the least severe log records written (to stderr)"
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="text lines, or one JSON object a line for a log collector"
    )
    engine: EngineConfig = Field(default_factory=EngineConfig)

    @model_validator(mode="after")
    def _models_in_data_dir(self) -> Self:
        if self.engine.cache_dir is None:
            self.engine.cache_dir = str(self.data_dir / "models")
        return self


class GatewaySettings(StorageSettings, ProcessSettings):
    """Where the gateway listens, what it stores where, and its admission and engine budgets."""

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8000, ge=0, le=65535, description="port to listen on; 0 picks a free port")
    # gateway/cli/workers.py: N processes accept on one port (SO_REUSEPORT) in front of the same --engine(s);
    # state they must share (idempotency, quotas, revocation) lives in Redis, so N > 1 needs --redis.
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="gateway processes accepting on one port (SO_REUSEPORT); over 1 needs --redis and --engine",
    )
    # Each streamed token costs the gateway a write and a wake-up of the reply's task (docs/gateway.md,
    # "Benchmark: gateway CPU against its floor": 11-15% of a token's CPU saved at 4). Over 1, a stream's middle
    # events wait until that many are ready and go out in one write, each token later by up to N - 1 steps.
    stream_events_per_write: int = Field(
        default=1,
        ge=1,
        le=64,
        description="a stream's middle events sent per write (1: each at once; over 1 trades "
        "inter-token latency for gateway CPU); the first and the last are never held",
    )
    redis_url: str | None = Field(
        default=None,
        description="redis:// URL for shared idempotency and quotas (default: in memory)",
        json_schema_extra={"flags": ["--redis"]},
    )
    # Every Redis call's deadline; past it (or on a refused connection) the breaker opens and calls fail fast.
    redis_timeout_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="seconds each Redis call may take before the circuit breaker opens",
        json_schema_extra={"flags": ["--redis-timeout"]},
    )
    quota_on_redis_failure: Literal["open", "closed"] = Field(
        default="open",
        description="while Redis is unavailable: admit without quotas, counted and flagged by "
        "an X-Quota-Status header (open), or answer 503 (closed)",
    )
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="largest request body accepted")
    max_queued_requests: int = Field(default=256, ge=1, description="global admission queue bound")
    # A tenant's default 64 requests at a 2,048-token context fill half of this, never all (admission/queues.py).
    max_queued_tokens: int = Field(default=262144, ge=1, description="global bound on queued prompt tokens")
    default_tenant_queued_requests: int = Field(
        default=64, ge=1, description="queue bound of a tenant that sets none"
    )
    retry_jitter: float = Field(default=0.25, ge=0.0, le=1.0, description="random share added to Retry-After")
    prior_prefill_tokens_per_s: float = Field(
        default=2000.0,
        gt=0,
        allow_inf_nan=False,
        description="prefill rate admission assumes before the engine has measured one",
    )
    prior_iteration_s: float = Field(
        default=0.05,
        gt=0,
        allow_inf_nan=False,
        description="iteration time admission assumes before the engine has measured one",
    )
    idempotency_ttl_s: float = Field(
        default=86400.0,
        gt=0,
        description="seconds idempotency records are kept",
        json_schema_extra={"flags": ["--idempotency-ttl"]},
    )
    # 10 s covers openai-python's back-off (at most 8 s) after a read timeout.
    idempotent_orphan_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=600,
        description="seconds a run sent with an Idempotency-Key outlives its last "
        "reader, for a retry to attach (0: abort at once, like unkeyed runs)",
        json_schema_extra={"flags": ["--idempotent-orphan-grace"]},
    )
    key_cache_ttl_s: float = Field(default=5.0, gt=0, description="seconds a verified API key is cached")
    # gateway/tenant_watch.py: the one path by which a tenant changed anywhere (admin API, CLI, SQL) reaches
    # this gateway's key cache and its engines' weights.
    tenant_poll_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="seconds between re-reads of the tenants table: a weight or quota changed by "
        "`fairserve tenants set`, another gateway or SQL reaches this gateway and its engines within it",
        json_schema_extra={"flags": ["--tenant-poll-interval"]},
    )
    # Authentication failures allowed per client address (gateway/edge/auth_guard.py): a burst, then a rate.
    auth_failure_burst: int = Field(
        default=20, ge=1, description="failed authentications a client address may make at once before 429"
    )
    auth_failure_rate_per_s: float = Field(
        default=2.0,
        gt=0,
        description="failed authentications per second a client address may sustain",
        json_schema_extra={"flags": ["--auth-failure-rate"]},
    )
    # Refused work charged to its tenant (gateway/openai/refusal_budget.py): a burst, then a rate.
    refusal_burst: int = Field(
        default=20, ge=1, description="refused requests a tenant may make at once before 429"
    )
    refusal_rate_per_s: float = Field(
        default=2.0, gt=0, description="refused requests per second a tenant may sustain"
    )
    # Task and workflow-run reports per tenant (gateway/openai/tasks.py): a burst, then a rate.
    report_burst: int = Field(
        default=10, ge=1, description="task and workflow-run reports a tenant may read at once before 429"
    )
    report_rate_per_s: float = Field(
        default=2.0, gt=0, description="task and workflow-run reports per second a tenant may sustain"
    )
    # A tenant that keeps polling while told to wait (gateway/edge/auth_guard.py `refused`): more than
    # `report_hold_after` refusals within one Retry-After window hold its reports for `report_hold_s`.
    report_hold_after: int = Field(
        default=32,
        ge=0,
        description="report refusals a tenant may ignore within one Retry-After before it is held (0: never)",
    )
    # At most the longest Retry-After clients honour (admission/backoff.py): a longer one would be a 503.
    report_hold_s: float = Field(
        default=60.0,
        gt=0,
        le=RETRY_AFTER_CAP_S,
        description="seconds a tenant that ignores report refusals is held",
    )
    tokenize_concurrency_per_tenant: int = Field(
        default=2, ge=1, description="large prompts of one tenant tokenised off the event loop at once"
    )
    # Preprocessing off the event loop (gateway/openai/preprocess.py): large bodies validated, chats rendered,
    # prompts tokenised, on these threads, in fair order of each tenant's preprocessing CPU.
    tokenize_workers: int = Field(
        default=0,
        ge=0,
        le=64,
        description="preprocessing slots (threads validating, rendering and tokenising large requests off "
        "the event loop); 0: the cores less one, at least one",
    )
    # Every preprocessing thread shares the interpreter lock with the event loop that serves all tenants:
    # together they may hold it this fraction of the time (docs/gateway.md, "Preprocessing CPU").
    preprocess_cpu_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="fraction of one core that preprocessing off the event loop may spend, all tenants together",
    )
    preprocess_burst_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="CPU seconds of preprocessing that may run at once above the share",
    )
    preprocess_max_wait_s: float = Field(
        default=5.0,
        gt=0,
        le=120,
        allow_inf_nan=False,
        description="a request whose preprocessing would wait longer is refused 429 preprocessing_busy",
    )
    # OpenAI's own limit, so a client that works there is never refused here; validating costs the event
    # loop per message (docs/gateway.md, "The event loop's budget").
    max_chat_messages: int = Field(
        default=2048, ge=1, description="messages (and text parts) a chat completion may carry"
    )
    # Stored Responses (`previous_response_id`), in this process, per tenant: one tenant's traffic never
    # evicts another's, and the memory is at most tenants x the bound (gateway/openai/responses_api/store.py).
    responses_store_entries: int = Field(
        default=256, ge=0, le=100_000, description="stored Responses kept per tenant (0: none are kept)"
    )
    responses_store_chars: int = Field(
        default=8 * 2**20,
        ge=0,
        le=2**31,
        description="characters of stored Responses (their turns and bodies as JSON) kept per tenant",
    )
    # Measured before any parser sees the body (gateway/openai/body_depth.py): every JSON parser on the
    # request path recurses per level (pydantic's stops at 200, msgspec and json at about 1,000), and so do
    # the schema copies and compiles after it. A chat's content parts are 5 levels; a schema nested 28
    # levels deep fits.
    max_json_depth: int = Field(
        default=MAX_JSON_DEPTH,
        ge=8,
        le=150,
        description="nesting levels (arrays and objects) a request body may have",
    )
    # Debugging what holds the event loop (docs/gateway.md, "The event loop's budget"): off by default,
    # since the loop's debug mode slows every request.
    loop_debug: bool = Field(
        default=False,
        description="log every event-loop callback that runs longer than --loop-budget-ms, with its route "
        "(runs the loop in debug mode: slower)",
    )
    loop_budget_ms: float = Field(
        default=20.0,
        gt=0,
        le=10_000,
        description="the longest an event-loop callback may run (see --loop-debug)",
    )
    # Connections (gateway/edge/connections.py): what a client may hold open before its key is known.
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="seconds a request's headers may take to arrive before its connection is closed",
        json_schema_extra={"flags": ["--header-timeout"]},
    )
    keep_alive_timeout_s: float = Field(
        default=5.0,
        ge=1,
        le=300,
        description="seconds an idle keep-alive connection is kept open",
        json_schema_extra={"flags": ["--keep-alive-timeout"]},
    )
    max_unkeyed_connections_per_address: int = Field(
        default=256,
        ge=1,
        description="open connections a client address may hold before one of them carries a valid key",
    )
    forwarded_allow_ips: str = Field(
        default="",
        description="comma-separated proxy addresses whose X-Forwarded-For/-Proto are trusted "
        "(default none: the TCP peer is the client)",
    )
    demo_tenant: str = Field(default="demo", description="tenant given a key on a deployment's first start")
    # The banner prints the demo key and the tokens on a terminal and, elsewhere (systemd, a pipe), the files
    # holding them, so a journal never stores a key. `make serve`, the quick start, asks for them always.
    print_secrets: bool = Field(
        default=False,
        description="print the demo key and tokens in the start-up banner even when stdout is not a "
        "terminal (make serve does; leave it off under systemd)",
    )
    access_log: bool = Field(
        default=False,
        description="log one line per request (logger fairserve.access): tenant, status, tokens, "
        "queue and total time, request id; never a key",
    )
    metrics_tenants: int = Field(default=50, ge=0, description="tenants given their own metric labels")
    # /metrics on the main port needs the metrics (or admin) token. A metrics port, if set, serves the same
    # registry without a credential, so it listens on loopback unless told otherwise.
    metrics_host: str = Field(
        default="127.0.0.1",
        description="address of the --metrics-port listener (it needs no credential: keep it private)",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="also serve /metrics here without a credential (the main port's /metrics needs a token)",
    )
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    # How a gateway with several engines picks one per request (routing/score.py); inert with one engine.
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    # Several models, fallbacks, cost factors, the default X-On-Infeasible (gateway/model_settings.py).
    models: ModelSettings = Field(default_factory=ModelSettings)
    # Engines fairserve does not own (vLLM, SGLang, TGI, `transformers serve`), fronted with fair share
    # (upstream/, docs/upstream.md): `--upstream MODEL=URL`, `--upstream-kind`, the dispatch window.
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    # The engine loop in its own process (ProcessEngine) rather than a thread sharing the gateway's GIL:
    # on by measurement (docs/gateway.md, "Benchmark: gateway overhead").
    engine_process: bool = Field(default=True, description="run the engine loop in its own process")
    restart_engine: bool = Field(
        default=True, description="replace a dead engine worker (process engine only)"
    )
    # Engines started on their own (`fairserve engine --listen ...`) that this gateway attaches to instead
    # of starting one: none = the gateway's own engine, as always.
    engines: list[str] = Field(
        default_factory=list,
        description="tcp://HOST:PORT of a running `fairserve "
        "engine` to serve from instead of starting one (repeatable)",
        json_schema_extra={"flags": ["--engine"]},
    )
    # The engine heartbeats every 50 ms. This much silence makes it suspect: no new requests while another
    # engine is alive, but what runs there keeps running (a starved CPU or a GC pause is silent too).
    engine_heartbeat_timeout_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="seconds of silence after which an --engine is suspect (no new requests while "
        "another is alive)",
        json_schema_extra={"flags": ["--engine-heartbeat-timeout"]},
    )
    # This much silence (or a dropped connection, the engine's goodbye, a restart) makes it lost: its
    # requests in flight fail with a retryable 503. docs/engine.md "Suspect and lost".
    engine_lost_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="seconds of silence after which an --engine is lost and its requests in flight fail "
        "(retryable 503); a dropped connection counts at once",
        json_schema_extra={"flags": ["--engine-lost-timeout"]},
    )

    @model_validator(mode="before")
    @classmethod
    def _one_model_is_the_engines(cls, data: Any) -> Any:
        return one_local_model(data)

    @model_validator(mode="after")
    def _ledger_in_data_dir(self) -> GatewaySettings:
        if self.ledger.data_dir is None:
            self.ledger.data_dir = str(self.data_dir)
        return self

    @property
    def preprocess_slots(self) -> int:
        """`tokenize_workers`, or for 0 the cores less one (at least one)."""
        return self.tokenize_workers or max(1, (os.cpu_count() or 1) - 1)

    @model_validator(mode="after")
    def _no_tenant_fills_the_tokenizers(self) -> GatewaySettings:
        # An explicit count of several slots must leave another tenant one; with the default (as many as
        # the cores allow) or a single slot, the fair order keeps one tenant from the others' turns.
        if self.tokenize_workers > 1 and self.tokenize_concurrency_per_tenant >= self.tokenize_workers:
            raise ValueError(
                f"--tokenize-concurrency-per-tenant ({self.tokenize_concurrency_per_tenant}) must be below "
                f"--tokenize-workers ({self.tokenize_workers}): one tenant must not hold every worker"
            )
        return self

    @model_validator(mode="after")
    def _lost_after_suspect(self) -> GatewaySettings:
        if self.engine_lost_timeout_s < self.engine_heartbeat_timeout_s:
            raise ValueError(
                f"--engine-lost-timeout ({self.engine_lost_timeout_s}) must be at least "
                f"--engine-heartbeat-timeout ({self.engine_heartbeat_timeout_s}): an engine is suspect first"
            )
        return self

    @field_validator("engines")
    @classmethod
    def _engine_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            check_address(address)
        if len(set(value)) != len(value):
            raise ValueError("the same engine address is given twice")
        return value

    @field_validator("cluster_key_file")
    @classmethod
    def _readable_key(cls, value: Path | None) -> Path | None:
        if value is not None:
            ClusterKey.load(value)  # ClusterKeyError (a ValueError) names what is wrong
        return value

    def engine_silence(self) -> SilenceBounds:
        """How long an attached engine may be silent before it is suspect, and before it is lost."""
        return SilenceBounds(self.engine_heartbeat_timeout_s, self.engine_lost_timeout_s)

    def cluster_key(self) -> ClusterKey | None:
        """The engines' key pairs, when a key file is set."""
        return None if self.cluster_key_file is None else ClusterKey.load(self.cluster_key_file)

    def admission_settings(self) -> AdmissionSettings:
        """The admission layer's view of these settings."""
        return AdmissionSettings(
            bounds=QueueBounds(
                max_queued_requests=self.max_queued_requests,
                max_queued_tokens=self.max_queued_tokens,
                default_tenant_queued_requests=self.default_tenant_queued_requests,
            ),
            retry_jitter=self.retry_jitter,
            priors=RatePriors(self.prior_prefill_tokens_per_s, self.prior_iteration_s),
            fair_policy=policy_entry(self.engine.fairness.policy).interleaves_tenants,
        )


def raw_sources(config_file: Path | None) -> dict[str, dict[str, Any]]:
    """What the environment and the TOML file each set, as nested dicts (for `fairserve config show`)."""
    found = {"env": EnvSettingsSource(GatewaySettings)()}
    if config_file is not None:
        found["file"] = TomlConfigSettingsSource(GatewaySettings, toml_file=config_file)()
    return found
