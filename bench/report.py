"""Turn a run's client outcomes and server metric deltas into report sections, and check their consistency."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from bench.loadgen import LoadResult, Outcome
from bench.probe import Sample, Timeline, by_label, delta, total
from bench.workloads import PlannedRequest, Workload, offered_tokens

COMPLETED = ("length", "stop")
REFUSED = (429, 503, 408)  # the server said no: counted as rejected, not failed


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """p50/p95/p99 (linear interpolation) and the count; None when there is nothing to measure."""
    qs = (
        [float(x) for x in np.percentile(np.asarray(values, dtype=float), [50, 95, 99])]
        if values
        else [None] * 3
    )
    return {"p50": qs[0], "p95": qs[1], "p99": qs[2], "n": len(values)}


def _mean(values: list[float], scale: float = 1.0) -> float | None:
    return float(np.mean(values)) * scale if values else None


def _counts(outcomes: list[Outcome]) -> dict[str, Any]:
    why = [(o, o.error_code or f"http_{o.status}") for o in outcomes]
    refused = Counter(code for o, code in why if o.status in REFUSED)
    failed = Counter(code for o, code in why if not o.accepted and o.status not in REFUSED)
    accepted = [o for o in outcomes if o.accepted]
    completed = sum(1 for o in accepted if o.finish_reason in COMPLETED)
    cancelled = sum(1 for o in accepted if o.finish_reason == "cancelled")
    return {
        "sent": len(outcomes),
        "accepted": len(accepted),
        "rejected": refused.total(),
        "rejected_by_reason": dict(sorted(refused.items())),
        "failed": failed.total(),
        "failed_by_reason": dict(sorted(failed.items())),
        "completed": completed,
        "cancelled": cancelled,
        "ended_otherwise": len(accepted) - completed - cancelled,
    }


def _latencies(done: list[Outcome], names: tuple[str, ...] = ("ttft", "tpot", "e2e")) -> dict[str, Any]:
    return {name: percentiles([v for o in done if (v := getattr(o, name)) is not None]) for name in names}


def _server(d: Sample, timeline: Timeline) -> dict[str, Any]:
    v = {k.removeprefix("fairserve_"): x for k, x in timeline.values.items()}
    occ = [u / t for u, t in zip(v["kv_blocks_used"], v["kv_blocks_total"], strict=True) if t > 0]
    batch = v["batch_size"]

    def nonzero(name: str, label: str) -> dict[str, float]:
        return {k: x for k, x in by_label(d, name, label).items() if x}

    return {
        "requests_by_status": {k: int(x) for k, x in nonzero("fairserve_requests_total", "status").items()},
        "admission_rejections_by_reason": {
            k: int(x) for k, x in nonzero("fairserve_admission_rejections_total", "reason").items()
        },
        **{
            name: int(total(d, f"fairserve_{name}_total"))
            for name in ("preemptions", "recomputed_tokens", "kv_alloc_failures", "cancel_lag_tokens")
        },
        "charged_service_by_tenant": nonzero("fairserve_charged_service_total", "tenant"),
        "samples": len(timeline.t),
        "kv_occupancy_mean": _mean(occ),
        "kv_occupancy_peak": max(occ) if occ else None,
        "batch_size_mean": _mean(batch),
        "batch_size_max": max(batch) if batch else None,
        "iteration_ms_mean": _mean([x for x in v["iteration_seconds"] if x > 0], 1e3),
    }


def _tenants(
    outcomes: list[Outcome],
    workload: Workload,
    service: dict[str, float],
    good: set[str],
    planned: list[PlannedRequest],
    timeline: Timeline,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    all_service = sum(service.values()) or 0.0
    for t in workload.tenants:
        mine = [o for o in outcomes if o.tenant == t.name]
        done = [o for o in mine if o.accepted and o.finish_reason in COMPLETED]
        svc = service.get(t.name)
        prompt_tokens, output_tokens = offered_tokens([p for p in planned if p.tenant == t.name])
        out[t.name] = {
            "weight": t.weight,
            "share_of_offered": t.share,
            "offered_prompt_tokens": prompt_tokens,
            "offered_output_tokens": output_tokens,
            "backlogged_fraction": timeline.backlogged_fraction(t.name),
            "arrival": t.arrival,
            "noisy": t.noisy,
            "sent": len(mine),
            "completed": len(done),
            "rejected": sum(1 for o in mine if o.status in REFUSED),
            "good": sum(1 for o in done if o.request_id in good),
            "charged_service": svc,
            "service_share": (svc / all_service) if svc is not None and all_service else None,
            **_latencies(done, ("ttft", "e2e")),
        }
    return out


def _cancellation(outcomes: list[Outcome], cancel_lag_tokens: int) -> dict[str, Any] | None:
    tasks = {o.task_id for o in outcomes if o.task_id}
    if not tasks:
        return None
    subject = [o for o in outcomes if o.cancel_sent_at is not None]
    cancelled = [o for o in subject if o.finish_reason == "cancelled"]
    lag = [o.end_at - o.cancel_sent_at for o in cancelled if o.end_at is not None and o.cancel_sent_at]
    return {
        "tasks": len(tasks),
        "tasks_with_a_kept_attempt": sum(1 for o in outcomes if o.kept),
        "attempts_cancel_sent": len(subject),
        "attempts_cancelled": len(cancelled),
        "cancel_to_stream_end_s": percentiles(lag),
        "tokens_computed_after_cancel": cancel_lag_tokens,
        "tokens_after_cancel_per_cancelled": (cancel_lag_tokens / len(cancelled)) if cancelled else None,
        "completion_tokens_of_cancelled": sum(o.completion_tokens for o in cancelled),
    }


def engine_tokens(o: Outcome) -> int:
    """Prompt tokens computed plus output tokens of one attempt, as the server's usage reported them."""
    return max(o.prompt_tokens - o.cached_tokens, 0) + o.completion_tokens if o.accepted else 0


def cost_per_outcome(outcomes: list[Outcome], workload: Workload, good: set[str]) -> dict[str, Any]:
    """Per tenant: verified completions (the goodput set: kept, completed, within the SLO), the engine
    tokens of every attempt and their ratio; for fan-out, the tokens of attempts not kept per task, split
    into cancelled branches and retries (answers produced and thrown away)."""
    tenants: dict[str, Any] = {}
    for t in workload.tenants:
        mine = [o for o in outcomes if o.tenant == t.name]
        verified, tokens = sum(1 for o in mine if o.request_id in good), sum(engine_tokens(o) for o in mine)
        tenants[t.name] = {
            "verified_completions": verified,
            "engine_tokens": tokens,
            "engine_tokens_per_verified": tokens / verified if verified else None,
        }
    report: dict[str, Any] = {"tenants": tenants}
    if workload.fanout > 1:
        tasks = len({o.task_id for o in outcomes if o.task_id})
        losers = [o for o in outcomes if o.task_id and not o.kept]
        cancelled = sum(engine_tokens(o) for o in losers if o.finish_reason == "cancelled")
        retries = sum(engine_tokens(o) for o in losers if o.finish_reason != "cancelled")
        report["wasted_tokens_per_task"] = {
            "tasks": tasks,
            "cancelled_branches": cancelled / tasks if tasks else None,
            "retries": retries / tasks if tasks else None,
        }
    return report


def summarise(
    workload: Workload,
    planned: list[PlannedRequest],
    rate: float,
    duration_s: float,
    result: LoadResult,
    before: Sample,
    after: Sample,
    timeline: Timeline,
    mode: str = "open-loop",
) -> dict[str, Any]:
    """One workload run as a report section."""
    outcomes = result.outcomes
    # The window runs from the first arrival slot to the later of the plan's end and the last response.
    wall = max(result.wall_s, duration_s, 1e-9)
    counts = _counts(outcomes)
    done = [o for o in outcomes if o.accepted and o.finish_reason in COMPLETED]
    # Fan-out: only the kept attempt is a user-visible result; the losers are cancelled by design.
    useful = [o for o in done if o.kept] if workload.fanout > 1 else done
    good = {o.request_id for o in useful if workload.slo.met(o.ttft, o.tpot, o.e2e)}
    server = _server(delta(before, after), timeline)
    per_s = 1 / duration_s if duration_s > 0 else 0.0
    prompt_tokens, output_tokens = offered_tokens(planned)
    return {
        "workload": workload.name,
        "mode": mode,
        "rate": rate,
        "duration_s": duration_s,
        "wall_s": result.wall_s,
        "send_s": result.send_s,
        "window_s": wall,
        "offered": {
            "requests_per_s": len(planned) * per_s,  # arrivals (tasks)
            "http_requests_per_s": counts["sent"] * per_s,
            "prompt_tokens_per_s": prompt_tokens * per_s,
            "output_tokens_per_s": output_tokens * per_s,
        },
        "counts": counts,
        "achieved": {
            "requests_per_s": len(useful) / wall,
            "completed_per_s": counts["completed"] / wall,
            "output_tokens_per_s": sum(o.completion_tokens for o in done) / wall,
            "computed_output_tokens_per_s": sum(o.completion_tokens for o in outcomes if o.accepted) / wall,
            "goodput_requests_per_s": len(good) / wall,
            "goodput_fraction": len(good) / len(useful) if useful else 0.0,
            "good": len(good),
            "useful": len(useful),
        },
        "latency_s": _latencies(done),
        "tenants": _tenants(outcomes, workload, server["charged_service_by_tenant"], good, planned, timeline),
        "server": server,
        "cancellation": _cancellation(outcomes, server["cancel_lag_tokens"]),
        "cost_per_outcome": cost_per_outcome(outcomes, workload, good),
        "timeline": {
            "t": timeline.t,
            **{k.removeprefix("fairserve_"): v for k, v in timeline.values.items()},
        },
    }


def capacity_point(sweep: list[dict[str, Any]], min_good_fraction: float = 0.9) -> dict[str, Any] | None:
    """The useful capacity: the highest offered load whose SLO goodput is still >= 90% of what completed
    (before goodput falls, not where raw token emission peaks)."""
    ok = [
        p
        for p in sweep
        if p["counts"]["sent"]
        and p["achieved"]["goodput_fraction"] >= min_good_fraction
        and p["counts"]["rejected"] <= 0.1 * p["counts"]["sent"]
        and p["achieved"]["goodput_requests_per_s"] >= min_good_fraction * p["offered"]["requests_per_s"]
    ]
    if not ok:
        return None
    best = max(ok, key=lambda p: p["offered"]["requests_per_s"])
    return {
        "offered_requests_per_s": best["offered"]["requests_per_s"],
        "rate": best["rate"],
        "goodput_requests_per_s": best["achieved"]["goodput_requests_per_s"],
        "rule": f"highest offered load whose SLO goodput is >= {min_good_fraction:.0%} of the offered load "
        f"and of completions, with <= 10% rejected",
    }


def consistency_problems(section: dict[str, Any]) -> list[str]:
    """Internal-consistency violations of one run section (empty when it adds up)."""
    c, a, problems = section["counts"], section["achieved"], []
    if c["sent"] != c["accepted"] + c["rejected"] + c["failed"]:
        problems.append(f"sent {c['sent']} != accepted + rejected + failed")
    if c["accepted"] != c["completed"] + c["cancelled"] + c["ended_otherwise"]:
        problems.append("accepted != completed + cancelled + ended otherwise")
    if sum(c["rejected_by_reason"].values()) != c["rejected"]:
        problems.append("rejections by reason do not sum")
    problems += [
        f"{name} percentiles out of order"
        for name, p in section["latency_s"].items()
        if p["n"] and not (p["p50"] <= p["p95"] <= p["p99"])
    ]
    if not a["goodput_requests_per_s"] <= a["requests_per_s"] + 1e-9 <= a["completed_per_s"] + 2e-9:
        problems.append("goodput > throughput")
    if any(math.isnan(v) for v in a.values() if isinstance(v, float)):
        problems.append("NaN in achieved")
    return problems
