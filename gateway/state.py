"""GatewayState: the long-lived parts of one gateway process, built at startup and closed at shutdown."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client import start_http_server

from admission.controller import AdmissionController
from admission.edge import EdgeAdmission
from admission.model_feasibility import ModelRates
from admission.quota import QuotaStore, make_quota
from admission.quota_redis import quota_metrics
from admission.redis_link import RedisLink, connect
from billing import BillingStore, Database, KeyCache, Ledger, default_db_url
from engine import EngineClient, EngineStartError, engine_client
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.roles import RoleAwareEngine
from gateway.adapters import AdapterRegistry
from gateway.admin.rejections import RejectionLog
from gateway.edge.auth import ensure_admin_token, ensure_metrics_token
from gateway.edge.auth_guard import FailureBudget
from gateway.edge.key_events import KeyEvents
from gateway.engine_health import EngineHealth
from gateway.idempotency.records import IdempotencyStore, make_idempotency_store
from gateway.model_engines import local_models
from gateway.openai.preprocess import PreprocessGate
from gateway.openai.refusal_budget import RefusalBudget
from gateway.openai.responses_api.store import ResponseStore
from gateway.openai.runs import RunRegistry
from gateway.ops.metrics import GatewayMetrics, TenantLabels
from gateway.ops.tracing import GatewayTracing, make_gateway_tracing
from gateway.prefixes import PrefixRegistry
from gateway.settings import GatewaySettings
from gateway.tenant_watch import TenantWatch
from gateway.upstreams import upstream_engines
from routing import ModelRouter, engine_loads
from routing.roles import role_router

log = logging.getLogger(__name__)
TENANT_REFRESH_S = 10.0


@dataclass
class GatewayState:
    """Engine, stores, admission and metrics shared by every request of one app."""

    settings: GatewaySettings
    engine: EngineClient
    owns_engine: bool
    db: Database
    store: BillingStore
    keys: KeyCache
    ledger: Ledger
    quota: QuotaStore
    idempotency: IdempotencyStore
    admission: AdmissionController
    metrics: GatewayMetrics
    admin_token: str
    metrics_token: str
    auth_budget: FailureBudget
    redis: RedisLink | None = None  # shared by quotas and idempotency, behind one breaker
    runs: RunRegistry = field(default_factory=RunRegistry)
    rejections: RejectionLog = field(default_factory=RejectionLog)  # recent ones, for /admin
    # Request ids whose ledger row this process wrote recently: the ledger writes behind, so a reused
    # X-Request-Id must be caught here before its first row reaches SQL.
    finished_ids: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)  # (tenant, id)
    draining: bool = False
    engine_health: EngineHealth = field(default_factory=EngineHealth)  # engines down, one by one
    # (engine id, completion tokens) of rows journaled, to confirm to attached engines; None: none attached
    billed_ids: list[tuple[str, int]] | None = None
    # Gateway identities known to be this deployment's (billing/gateways.py): whose dead requests it bills.
    deployment_gateways: set[str] = field(default_factory=set)
    metrics_server: Any = None  # the unauthenticated --metrics-port listener (prometheus_client), if any
    key_events: KeyEvents | None = None  # Redis pub/sub invalidation of the key cache (with --redis)
    tracing: GatewayTracing | None = None  # OpenTelemetry spans (gateway/ops/tracing.py); None: off
    _tenants_at: float = 0.0
    edge: EdgeAdmission = field(init=False)  # admission and quota behind one call (admission/edge.py)
    refusals: RefusalBudget = field(init=False)  # refused work charged to its tenant
    preprocess: PreprocessGate = field(init=False)  # preprocessing CPU, bounded and in fair order
    reports: FailureBudget = field(init=False)  # task and workflow-run reports a tenant may read
    model_rates: ModelRates = field(init=False)  # each model's learned rates (admission/model_feasibility.py)
    prefixes: PrefixRegistry = field(init=False)  # public prompt prefixes (gateway/prefixes.py)
    adapters: AdapterRegistry = field(init=False)  # LoRA adapters, public or a tenant's (gateway/adapters.py)
    responses: ResponseStore = field(
        init=False
    )  # stored Responses, per tenant (gateway/openai/responses_api/)
    tenant_watch: TenantWatch = field(init=False)  # tenant changes from SQL to keys and engines

    def __post_init__(self) -> None:
        self.edge = EdgeAdmission(self.admission, self.quota)
        self.model_rates = ModelRates(self.admission.settings.priors)
        s = self.settings
        self.refusals = RefusalBudget(s.refusal_burst, s.refusal_rate_per_s)
        slots = s.preprocess_slots
        self.preprocess = PreprocessGate(
            slots,
            min(s.tokenize_concurrency_per_tenant, max(1, slots - 1)),
            min(s.preprocess_cpu_share, float(slots)),
            s.preprocess_burst_s,
            s.preprocess_max_wait_s,
        )
        self.reports = FailureBudget(
            s.report_burst, s.report_rate_per_s, hold_after=s.report_hold_after, hold_s=s.report_hold_s
        )
        self.responses = ResponseStore(s.responses_store_entries, s.responses_store_chars)
        self.tenant_watch = TenantWatch(
            self.store, self.engine, self.keys, on_change=lambda _: self.refresh_tenant_labels(force=True)
        )
        self.prefixes = PrefixRegistry(self.db)
        try:
            self.prefixes.reload()
        except Exception:  # serve without public prefixes rather than not at all; the refresh retries
            log.warning("could not load public prefixes", exc_info=True)
        self.adapters = AdapterRegistry(self.db, s.engine.lora)
        try:
            self.adapters.reload()
        except Exception:  # serve the `--lora` adapters rather than nothing; the refresh retries
            log.warning("could not load LoRA adapters", exc_info=True)

    def refresh_tenant_labels(self, force: bool = False) -> None:
        """Re-read configured tenants for metric labels (cheap, at most every few seconds)."""
        now = time.monotonic()
        if not force and now - self._tenants_at < TENANT_REFRESH_S:
            return
        self._tenants_at = now
        try:
            self.metrics.labels.configure((t.id, t.name) for t in self.store.list_tenants())
        except Exception:  # labels are cosmetic; a database hiccup must not fail a scrape
            log.warning("could not refresh tenant labels", exc_info=True)

    def ready(self) -> tuple[bool, dict[str, bool]]:
        """Readiness and its parts: some model's engine up, database reachable, admitting.

        One model's engine down does not make the gateway unready: its requests get 503 with Retry-After
        here while the other models serve, and /readyz lists each engine's health.
        """
        checks = {
            "engine": self.engine_health.serves_any(self.engine),
            "database": bool(self.db.ping()),
            "admitting": not self.draining,
        }
        return all(checks.values()), checks

    async def dependencies(self) -> dict[str, Any]:
        """Optional dependencies the gateway degrades without (Redis): their state, for /readyz.

        A closed breaker is confirmed with one PING (bounded by the Redis timeout); an open one is
        reported without touching Redis. Degraded is not unready: quotas fail open or closed as set and
        requests without an Idempotency-Key are served, so taking every replica out of rotation because
        their shared Redis is away would turn a degradation into an outage.
        """
        if self.redis is None:
            return {}
        await self.redis.breaker.check()
        return {
            "redis": {
                **self.redis.breaker.snapshot(),
                "quota_on_failure": self.settings.quota_on_redis_failure,
            }
        }


def gateway_engine(settings: GatewaySettings) -> EngineClient:
    """The engine a gateway serves from: `owned_engine`, beside each `--upstream` model's (gateway/upstreams.py).

    With `--upstream` and neither `--model` nor `--engine`, the gateway serves the upstream models alone.
    """
    upstreams = upstream_engines(settings)
    if not upstreams:
        return owned_engine(settings)
    only_upstreams = (
        settings.engine.model is None and not settings.models.local_models and not settings.engines
    )
    if only_upstreams:
        return ModelRouter(upstreams)
    own = owned_engine(settings)
    if not own.model_name:  # one attached --engine names its model when reached (started twice: no-op)
        own.start()
    groups = dict(own.groups) if isinstance(own, ModelRouter) else {own.model_name: own}
    clash = sorted(set(groups) & set(upstreams))
    if clash:
        raise EngineStartError(f"model {clash[0]!r} is both an --upstream and one of fairserve's own engines")
    return ModelRouter({**groups, **upstreams})


def owned_engine(settings: GatewaySettings) -> EngineClient:
    """The engine a gateway serves from: its own (thread or worker process) unless `--engine` names one.

    Several `--engine` go behind an EngineRouter. An attached engine is reached over TCP (engine/serving/remote/client.py); the gateway neither starts nor stops
    it, and it rejoins by itself after the engine comes back.
    """
    if not settings.engines:
        if len(settings.models.local_models) > 1:
            return local_models(settings)
        return engine_client(settings.engine, in_process=not settings.engine_process)
    if settings.models.local_models:
        raise EngineStartError("give --engine or several --model, not both")
    if len(settings.engines) == 1:
        return RemoteEngine(settings.engines[0], settings.engine_silence(), settings.cluster_key())
    # Several: each is reached first (its announce names the model and brings the tokenizer), then the
    # router (routing/router.py) picks one per request: one router per model (routing/models.py), or a
    # DisaggRouter over prefill and decode engines of one model (routing/roles.py).
    key = settings.cluster_key()
    remotes = [RoleAwareEngine(address, settings.engine_silence(), key) for address in settings.engines]
    try:
        for remote in remotes:
            remote.start()
        engines = dict(zip(settings.engines, remotes, strict=True))
        if len({remote.model_name for remote in remotes}) > 1:  # several models: one router per model
            if any(remote.role != "both" for remote in remotes):
                raise EngineStartError("prefill/decode engines (--role) serve one model behind a gateway")
            return ModelRouter.of(engines.items(), settings.routing)
        return role_router(engines, {a: r.role for a, r in engines.items()}, settings.routing)
    except BaseException:
        for remote in remotes:
            remote.shutdown(timeout_s=1.0)
        raise


def start_gateway_engine(settings: GatewaySettings) -> EngineClient:
    """`gateway_engine`, started; EngineStartError when it cannot be, with nothing of it left running."""
    engine = gateway_engine(settings)  # several attached engines are started (or released) in there
    try:
        engine.start()
    except BaseException:
        engine.shutdown(timeout_s=1.0)
        raise
    # Once reached (a refusal to start stays one line): the engine warns too; an operator reads either log.
    if settings.engines and settings.cluster_key_file is None:
        log.warning(
            "no --cluster-key: the engines at %s admit any process that reaches them, which can submit work "
            "as any tenant (this deployment never bills such work, docs/billing.md)",
            ", ".join(settings.engines),
        )
    return engine


def build_state(
    settings: GatewaySettings, engine: EngineClient | None, owns_engine: bool | None = None
) -> GatewayState:
    """Open the database (migrated), ledger, stores, and the engine unless one is given.

    `owns_engine` (default: whether the engine is built here) says whether closing the state stops it.
    Should anything after the engine fail, an owned engine is stopped before the error leaves: a gateway
    that refuses to start leaves no worker process behind.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(settings.db_url or default_db_url(settings.data_dir))
    db.upgrade()
    store = BillingStore(db)
    owns = engine is None if owns_engine is None else owns_engine
    if engine is None:
        engine = start_gateway_engine(settings)
    try:
        return _state_around(settings, db, store, engine, owns)
    except BaseException:
        if owns:
            engine.shutdown(timeout_s=5.0)
        db.dispose()
        raise


def _state_around(
    settings: GatewaySettings, db: Database, store: BillingStore, engine: EngineClient, owns_engine: bool
) -> GatewayState:
    """The stores, admission and metrics around a started engine."""
    labels = TenantLabels(settings.metrics_tenants)
    metrics = GatewayMetrics(labels, engine.stats, partial(engine_loads, engine))
    ledger = Ledger(db, settings.ledger, registry=metrics.registry)
    ledger.start()
    quota_metrics(metrics.registry)  # exported (at 0) with or without Redis, as documented
    link = (
        connect(settings.redis_url, settings.redis_timeout_s, registry=metrics.registry)
        if settings.redis_url
        else None
    )
    state = GatewayState(
        settings=settings,
        engine=engine,
        owns_engine=owns_engine,
        db=db,
        store=store,
        keys=KeyCache(store, ttl_s=settings.key_cache_ttl_s),
        ledger=ledger,
        quota=make_quota(
            link, fail_open=settings.quota_on_redis_failure == "open", registry=metrics.registry
        ),
        idempotency=make_idempotency_store(link, settings.idempotency_ttl_s, registry=metrics.registry),
        admission=AdmissionController(settings.admission_settings()),
        metrics=metrics,
        admin_token=ensure_admin_token(settings.data_dir),
        metrics_token=ensure_metrics_token(settings.data_dir),
        auth_budget=FailureBudget(settings.auth_failure_burst, settings.auth_failure_rate_per_s),
        redis=link,
        tracing=make_gateway_tracing(settings.engine),
    )
    state.refresh_tenant_labels(force=True)
    state.tenant_watch.apply()  # the first read: later ones apply what changed since
    if settings.redis_url is not None:
        state.key_events = KeyEvents(settings.redis_url, state.keys)
        state.key_events.start()
    if settings.metrics_port is not None:
        # prometheus_client's own WSGI listener on a thread: a maintained server for a scrape-only port.
        state.metrics_server, _thread = start_http_server(
            settings.metrics_port, settings.metrics_host, registry=metrics.registry
        )
    return state


async def close_state(state: GatewayState) -> None:
    """Flush the ledger and release stores; stop the engine if this app started it."""
    if state.key_events is not None:
        state.key_events.close()
    if state.metrics_server is not None:
        state.metrics_server.shutdown()
        state.metrics_server.server_close()
    if state.owns_engine:
        state.engine.shutdown(timeout_s=state.settings.grace_period_s)
    if state.tracing is not None:
        state.tracing.shutdown()
    state.preprocess.close()
    state.ledger.close(timeout_s=10.0)
    await state.idempotency.close()
    await state.quota.close()
    if state.redis is not None:
        await state.redis.close()
    state.db.dispose()
