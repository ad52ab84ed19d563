"""bench.upstream's arithmetic: tenants' token shares per window, TTFT ratios, throughput, the ledger.

Shares are counted at the client, from the tokens each tenant was streamed: a request's first token at its
time to first token, the rest spread evenly up to its last byte (the load generator keeps those two times,
not one per token; with requests of a few seconds the error is a fraction of a 10 s window). A request's
tokens are its usage's completion tokens, else the bytes of its text (the embedded model's tokenizer is
bytes); never its chunks, which `transformers serve` sometimes packs with several tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from bench.loadgen import LoadResult, Outcome
from bench.report import percentiles


def token_times(o: Outcome, offset: float) -> list[float]:
    """When (seconds on the run's clock) each of `o`'s streamed tokens reached the client."""
    n = o.completion_tokens or o.text_bytes
    if not o.accepted or n == 0 or o.first_token_at is None or o.end_at is None:
        return []
    first, end = offset + o.first_token_at, offset + o.end_at
    step = (end - first) / (n - 1) if n > 1 else 0.0
    return [first + i * step for i in range(n)]


def window_shares(
    results: dict[str, LoadResult], start: float, stop: float, width_s: float, weights: dict[str, float]
) -> list[dict[str, Any]]:
    """Each whole window of `width_s` in [start, stop) on the shared clock (epoch seconds): tokens per
    tenant, each tenant's share, and the first tenant's tokens over the second's against the weights'."""
    times = {t: [x for o in r.outcomes for x in token_times(o, r.started)] for t, r in results.items()}
    a, b = list(weights)[:2]
    target = weights[a] / weights[b]
    windows = []
    left = start
    while left + width_s <= stop + 1e-9:
        right = left + width_s
        tokens = {t: sum(1 for x in xs if left <= x < right) for t, xs in times.items()}
        total = sum(tokens.values())
        ratio = tokens[a] / tokens[b] if tokens[b] else None
        windows.append(
            {
                "from_s": round(left - start, 3),
                "tokens": tokens,
                "share": {t: (n / total if total else None) for t, n in tokens.items()},
                "ratio": ratio,
                "ratio_over_weights": ratio / target if ratio is not None else None,
            }
        )
        left = right
    return windows


def within(windows: list[dict[str, Any]], tolerance: float) -> bool | None:
    """Every window's ratio within ±tolerance of the weights' (None when there is no window)."""
    if not windows:
        return None
    return all(
        w["ratio_over_weights"] is not None and abs(w["ratio_over_weights"] - 1) <= tolerance for w in windows
    )


def ttft(outcomes: Iterable[Outcome]) -> dict[str, float | int | None]:
    """TTFT percentiles of the requests that completed."""
    return percentiles(
        [
            v
            for o in outcomes
            if o.accepted and o.finish_reason in ("length", "stop") and (v := o.ttft) is not None
        ]
    )


def ratio(a: float | int | None, b: float | int | None) -> float | None:
    return a / b if a is not None and b else None


def throughput(results: Iterable[LoadResult], start: float, stop: float) -> float:
    """Tokens streamed to every client per second inside [start, stop) on the shared clock."""
    n = sum(1 for r in results for o in r.outcomes for x in token_times(o, r.started) if start <= x < stop)
    return n / (stop - start) if stop > start else 0.0


def client_usage(results: dict[str, LoadResult]) -> dict[str, dict[str, int]]:
    """Per tenant: requests answered, the usage chunks' prompt and completion tokens, and the tokens of the
    text the clients were streamed (UTF-8 bytes: the embedded byte tokenizer's count)."""
    out = {}
    for tenant, r in results.items():
        ok = [o for o in r.outcomes if o.accepted]
        out[tenant] = {
            "requests": len(ok),
            "prompt_tokens": sum(o.prompt_tokens for o in ok),
            "completion_tokens": sum(o.completion_tokens for o in ok),
            "streamed_tokens": sum(o.text_bytes for o in ok),
        }
    return out


def ledger_against_clients(
    ledger: dict[str, dict[str, int]], clients: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """The ledger's totals per tenant beside what the clients were told (usage) and counted (streamed)."""
    rows: dict[str, Any] = {}
    for tenant, seen in clients.items():
        kept = ledger.get(tenant, {})
        rows[tenant] = {
            "ledger": kept,
            "clients": seen,
            "completion_equal_to_usage": kept.get("completion_tokens") == seen["completion_tokens"],
            "completion_over_streamed": ratio(kept.get("completion_tokens"), seen["streamed_tokens"]),
            "requests_equal": kept.get("requests") == seen["requests"],
        }
    return rows
