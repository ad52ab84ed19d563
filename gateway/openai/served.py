"""Which model serves a request, and how: the requested model's engine, the X-On-Infeasible policy read
from the request, and what admission made of it (gateway/openai/degrade.py) for the response and ledger."""

from __future__ import annotations

from dataclasses import dataclass, field

from billing.adapters import AdapterInfo
from engine import EngineClient
from gateway.edge.errors import APIError
from gateway.model_settings import ON_INFEASIBLE
from gateway.state import GatewayState
from routing import model_client, served_models

ON_INFEASIBLE_HEADER = "X-On-Infeasible"
DEGRADED_HEADER = "X-Degraded"


@dataclass(frozen=True)
class ServedAs:
    """The model a request is served by and its degradation (None: as asked), with the policy it asked for.

    `policy` is the request's own X-On-Infeasible (None: its tenant's default, else the server's).
    `degradation` is `fallback`, `partial` or `truncated`; `dropped` the prompt tokens truncation removed.
    `engine` is the model's engine(s), looked up once when the request is read (and again only for a
    fallback): every later stage (admission, the estimate, submit) takes it from here.
    """

    model: str
    engine: EngineClient = field(compare=False, repr=False)
    policy: str | None = None
    degradation: str | None = None
    dropped: int = 0
    partial_at_deadline: bool = False  # the engine ends it at its deadline with the tokens so far
    cost_factor: float = 1.0  # the served model's `--model-cost`
    lora: str | None = None  # the LoRA adapter `model` named (served over the default model's engines)
    lora_path: str | None = None  # that adapter's PEFT directory, from the gateway's adapter directory
    lora_registered: str | None = None  # when it was registered (None: `--lora`): RequestMeta.lora_registered

    def header(self) -> str | None:
        """The X-Degraded value, None when served as asked."""
        if self.degradation == "fallback":
            return f"fallback; model={self.model}"
        if self.degradation == "truncated":
            return f"truncated; dropped={self.dropped}"
        return self.degradation


def requested_policy(raw: str | None) -> str | None:
    """The request's X-On-Infeasible policy (None: not sent); 400 naming the header for a value not known."""
    if raw is None:
        return None
    policy = raw.strip().lower()
    if policy not in ON_INFEASIBLE:
        raise APIError(
            400,
            f"{ON_INFEASIBLE_HEADER} must be one of {', '.join(ON_INFEASIBLE)}",
            "invalid_header",
            ON_INFEASIBLE_HEADER,
        )
    return policy


def served_names(state: GatewayState, tenant_id: str) -> list[str]:
    """The names a key of the tenant may put in `model`: each served model, the default first, then the
    adapters it may use (public ones and its own; never another tenant's)."""
    names = [client.model_name for client in served_models(state.engine)]
    return names + [adapter.name for adapter in state.adapters.listed(tenant_id)]


def model_engine(state: GatewayState, model: str, tenant_id: str) -> tuple[EngineClient, AdapterInfo | None]:
    """The engine(s) serving `model` for the tenant, and the LoRA adapter it names (None: a model).

    An adapter runs over the default model's engines (docs/gateway.md, "LoRA adapters"). Any other name,
    another tenant's private adapter included, is the same 404 `model_not_found`, listing only the
    names this tenant may use: the answer does not depend on what other tenants registered.
    """
    engine = model_client(state.engine, model)
    if engine is not None:
        return engine, None
    adapter = state.adapters.visible(model, tenant_id)
    if adapter is not None:
        return served_models(state.engine)[0], adapter
    names = served_names(state, tenant_id)
    raise APIError(
        404,
        f"model {model!r} does not exist; this server serves {', '.join(repr(n) for n in names)}",
        "model_not_found",
        "model",
    )
