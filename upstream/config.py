"""UpstreamSettings: the `[upstream]` node of the settings tree: which engines fairserve does not own it
serves models from, what kind each is, and the dispatch window's bounds (docs/upstream.md).

Hung under `GatewaySettings.upstream` (gateway/settings.py), so every field is a `fairserve serve` flag
(`--upstream MODEL=URL`, `--upstream-kind`, `--upstream-window-max`, ...), a `FAIRSERVE_UPSTREAM__*`
variable and a key of the `[upstream]` TOML table.
"""

from __future__ import annotations

from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

UpstreamKind = Literal["auto", "vllm", "sglang", "tgi", "openai"]


def split_target(text: str) -> tuple[str, str]:
    """("MODEL", "URL") of one `--upstream MODEL=URL`; ValueError naming what is wrong."""
    model, sep, url = text.partition("=")
    model, url = model.strip(), url.strip().rstrip("/")
    if not sep or not model or not url:
        raise ValueError(f"upstream {text!r} is not MODEL=URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"upstream {text!r}: the URL must be http(s)://HOST[:PORT][/PATH]")
    return model, url


class UpstreamSettings(BaseModel):
    """OpenAI-compatible engines (vLLM, SGLang, TGI, `transformers serve`) that fairserve fronts."""

    model_config = ConfigDict(extra="forbid")

    targets: list[str] = Field(
        default_factory=list,
        description="MODEL=URL: serve MODEL from the OpenAI-compatible engine at URL (repeatable; several "
        "URLs for one MODEL are its replicas)",
        json_schema_extra={"flags": ["--upstream"]},
    )
    kind: UpstreamKind = Field(
        default="auto",
        description="what the upstream engines are: auto probes /metrics and /v1/models at start",
    )
    tokenizer: str | None = Field(
        default=None,
        description="a tokenizer directory for the upstream models (prompt checks and counting streamed "
        "tokens the engine reports no usage for); default: the engine's model directory when local, "
        "else the embedded model's",
    )
    max_model_len: int = Field(
        default=4096, ge=16, description="context of an upstream model when its /v1/models does not say"
    )
    window_min: int = Field(default=1, ge=1, le=4096, description="fewest requests in flight per replica")
    window_max: int = Field(default=64, ge=1, le=4096, description="most requests in flight per replica")
    window_start: int = Field(default=8, ge=1, le=4096, description="requests in flight per replica at start")
    window_max_unmetered: int = Field(
        default=8,
        ge=1,
        le=4096,
        description="most requests in flight per replica of an engine without a queue gauge (no /metrics: "
        "its batch filling is invisible, so this is its fairness knob; raise it for a large engine)",
    )
    metrics_interval_s: float = Field(
        default=0.05, gt=0, le=10, description="how often each replica's /metrics is read"
    )
    metrics_stale_s: float = Field(
        default=0.2, gt=0, le=60, description="metrics older than this count as a saturated engine"
    )
    start_timeout_s: float = Field(
        default=4.0, gt=0, le=60, description="how long the start-up probe waits for each upstream"
    )
    connect_timeout_s: float = Field(default=2.0, gt=0, le=60, description="connect timeout of each call")
    breaker_s: float = Field(
        default=2.0, gt=0, le=300, description="first back-off of a replica that failed (doubling, to 30 s)"
    )

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: list[str]) -> list[str]:
        seen: set[tuple[str, str]] = set()
        for item in value:
            pair = split_target(item)
            if pair in seen:
                raise ValueError(f"upstream {item!r} is given twice")
            seen.add(pair)
        return value

    @model_validator(mode="after")
    def _window(self) -> Self:
        if not self.window_min <= self.window_start <= self.window_max:
            raise ValueError("upstream windows: need window_min <= window_start <= window_max")
        if self.window_min > self.window_max_unmetered:
            raise ValueError("upstream windows: need window_min <= window_max_unmetered")
        return self

    def replicas(self) -> dict[str, list[str]]:
        """Each upstream model's replica URLs, in the order given."""
        out: dict[str, list[str]] = {}
        for item in self.targets:
            model, url = split_target(item)
            out.setdefault(model, []).append(url)
        return out
