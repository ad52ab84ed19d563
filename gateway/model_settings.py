"""ModelSettings: the `[models]` node of the settings tree: several local models, fallbacks, cost factors,
and what an infeasible deadline gets by default (docs/gateway.md, "Several models and degraded answers")."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from billing.validation import ON_INFEASIBLE_VALUES

# What a request whose deadline cannot be met gets (the X-On-Infeasible header, a tenant's default).
OnInfeasible = Literal["reject", "fallback", "partial", "truncate"]
ON_INFEASIBLE: tuple[str, ...] = ON_INFEASIBLE_VALUES  # the one list, where tenants store theirs


def _pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError(f"{text!r} is not {what}")
    return name.strip(), value.strip()


def one_local_model(data: Any) -> Any:
    """GatewaySettings' raw input with `--model DIR` given once moved to the engine's model (`engine.model`),
    as it always was; several stay in `models.local_models` (one local engine each)."""
    if not isinstance(data, dict):
        return data
    models, engine = data.get("models"), data.get("engine", {})
    if not isinstance(models, dict) or not isinstance(engine, dict) or "model" in engine:
        return data
    local = models.get("local_models")
    if isinstance(local, list) and len(local) == 1:
        return {**data, "models": {**models, "local_models": []}, "engine": {**engine, "model": local[0]}}
    return data


class ModelSettings(BaseModel):
    """Which models `serve` runs itself, where an infeasible request may fall back, and what each costs."""

    model_config = ConfigDict(extra="forbid")

    local_models: list[str] = Field(
        default_factory=list,
        description="the Hugging Face model directory to serve (default: the embedded model); repeat it "
        "to serve several, one local engine each",
        json_schema_extra={"flags": ["--model"]},
    )
    fallback_models: list[str] = Field(
        default_factory=list,
        description="BIG=SMALL: a request for BIG that cannot meet its deadline may be served by SMALL "
        "(X-On-Infeasible: fallback; repeatable, chains allowed)",
        json_schema_extra={"flags": ["--fallback-model"]},
    )
    model_costs: list[str] = Field(
        default_factory=list,
        description="NAME=F: the ledger charges a request served by NAME F times its engine service "
        "(repeatable; default 1)",
        json_schema_extra={"flags": ["--model-cost"]},
    )
    on_infeasible: OnInfeasible = Field(
        default="reject",
        description="what a request whose deadline cannot be met gets when neither its header nor its "
        "tenant says: reject (503), fallback, partial or truncate",
    )

    @field_validator("local_models")
    @classmethod
    def _directories(cls, value: list[str]) -> list[str]:
        for item in value:
            if not Path(item).is_dir():
                raise ValueError(f"model {item!r} is not a directory")
        names = [Path(item).resolve().name for item in value]
        if len(set(names)) != len(names):
            raise ValueError("two local models have the same directory name (the name clients send)")
        return value

    @field_validator("model_costs")
    @classmethod
    def _costs(cls, value: list[str]) -> list[str]:
        for item in value:
            _name, factor = _pair(item, "NAME=FACTOR")
            try:
                number = float(factor)
            except ValueError:
                raise ValueError(f"{item!r}: the cost factor must be a number") from None
            if not math.isfinite(number) or number <= 0:
                raise ValueError(f"{item!r}: the cost factor must be a finite number > 0")
        return value

    @model_validator(mode="after")
    def _no_cycles(self) -> Self:
        edges: dict[str, str] = {}
        for item in self.fallback_models:
            big, small = _pair(item, "BIG=SMALL")
            if big in edges:
                raise ValueError(f"fallback_models: {big!r} is given two fallbacks")
            edges[big] = small
        for start in edges:
            seen = {start}
            node = start
            while node in edges:
                node = edges[node]
                if node in seen:
                    raise ValueError(f"fallback_models: the chain from {start!r} loops back to {node!r}")
                seen.add(node)
        return self

    def fallback_chain(self, model: str) -> list[str]:
        """The models a request for `model` may be served by, in order: itself, then its fallbacks."""
        edges = dict(_pair(item, "BIG=SMALL") for item in self.fallback_models)
        chain = [model]
        while chain[-1] in edges:
            chain.append(edges[chain[-1]])
        return chain

    def cost_factor(self, model: str) -> float:
        """The charge multiplier of a request served by `model` (1 unless `--model-cost` says otherwise)."""
        for item in self.model_costs:
            name, factor = _pair(item, "NAME=FACTOR")
            if name == model:
                return float(factor)
        return 1.0
