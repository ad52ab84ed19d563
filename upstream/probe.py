"""The start-up probe: is each upstream there, what kind is it, and what does it call its model.

Bounded by `start_timeout_s` per replica, so an upstream that is down is one clear line within 5 s, as
an `--engine` that is not there is (gateway/cli/serve.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx

from upstream.errors import UpstreamStartError
from upstream.kinds import detect_kind

log = logging.getLogger("fairserve.upstream")


@dataclass(frozen=True)
class ProbeResult:
    """What one replica said about itself."""

    url: str
    kind: str
    upstream_model: str  # the id the engine knows the model by (sent as `model` in each call)
    max_model_len: int | None
    root: str | None  # /v1/models' `root`: where the engine loaded the model from (vLLM: a path or hub id)
    has_metrics: bool


def probe(url: str, model: str, kind: str, timeout_s: float) -> ProbeResult:
    """GET /v1/models (required) and /metrics (optional) of the replica at `url`."""
    try:
        with httpx.Client(base_url=url, timeout=timeout_s) as client:
            listed = client.get("/v1/models")
            listed.raise_for_status()
            try:
                page = client.get("/metrics", timeout=min(1.0, timeout_s / 4))
                metrics = page.text if page.status_code == 200 else None
            except httpx.HTTPError:
                metrics = None
    except httpx.HTTPError as exc:
        raise UpstreamStartError(f"upstream {model}={url} is not answering: {_reason(exc)}") from None
    try:
        data = listed.json()["data"]
        entries = {str(e["id"]): e for e in data}
    except (ValueError, KeyError, TypeError):
        raise UpstreamStartError(f"upstream {model}={url}: /v1/models is not an OpenAI model list") from None
    if model in entries:
        entry = entries[model]
    elif len(entries) == 1:
        entry = next(iter(entries.values()))
    else:
        raise UpstreamStartError(
            f"upstream {model}={url} serves {sorted(entries) or 'no model'}, not {model!r}"
        )
    found = detect_kind(metrics, entry.get("owned_by"))
    length = entry.get("max_model_len")
    result = ProbeResult(
        url,
        found if kind == "auto" else kind,
        str(entry["id"]),
        int(length) if isinstance(length, int) and length > 0 else None,
        str(entry["root"]) if entry.get("root") else None,
        metrics is not None,
    )
    log.info(
        "upstream %s=%s: %s (%s), model %r, /metrics %s, context %s",
        model,
        url,
        result.kind,
        "probed" if kind == "auto" else f"--upstream-kind {kind}; probe says {found}",
        result.upstream_model,
        "found" if metrics is not None else "absent",
        result.max_model_len or "not reported",
    )
    return result


def _reason(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"/v1/models answered {exc.response.status_code}"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    return type(exc).__name__ + (f" ({exc})" if str(exc) else "")
