"""The Markdown rendering of a bench report: declaration, key table, tenants, cost, sweep, comparisons, plots."""

from __future__ import annotations

from typing import Any

from bench.harness import table


def _f(v: Any, digits: int = 2, scale: float = 1.0) -> str:
    if v is None:
        return "-"
    if isinstance(v, int | float):
        return f"{v * scale:.{digits}f}"
    return str(v)


def _pct(p: dict[str, Any], scale: float = 1e3, qs: tuple[str, ...] = ("p50", "p95", "p99")) -> str:
    return " / ".join(_f(p[q], 0, scale) for q in qs)


def key_table(runs: list[dict[str, Any]]) -> list[str]:
    """One row per workload: offered vs achieved, counts, latency percentiles, goodput."""
    return table(
        "workload | offered req/s (tasks for fan-out) | achieved req/s | output tok/s | sent / accepted / rejected "
        "/ cancelled / completed | TTFT p50/p95/p99 ms | TPOT p50/p95/p99 ms | completion p50/p95/p99 ms | "
        "SLO goodput req/s (share)",
        "lrrrlllll",
        (
            f"{r['workload']} ({r['mode']}) | {_f(r['offered']['requests_per_s'])} | {_f(a['requests_per_s'])} | "
            f"{_f(a['output_tokens_per_s'], 1)} | {c['sent']} / {c['accepted']} / {c['rejected']} / "
            f"{c['cancelled']} / {c['completed']} | {_pct(lat['ttft'])} | {_pct(lat['tpot'])} | {_pct(lat['e2e'])} "
            f"| {_f(a['goodput_requests_per_s'])} ({_f(a['goodput_fraction'] * 100, 0)}%)"
            for r in runs
            for c, a, lat in [(r["counts"], r["achieved"], r["latency_s"])]
        ),
    )


def _server_table(runs: list[dict[str, Any]]) -> list[str]:
    return table(
        "workload | rejected by reason | KV occupancy mean / peak | preemptions | recomputed tokens | "
        "batch mean / max | iteration ms (mean)",
        "lllrrlr",
        (
            f"{r['workload']} | {', '.join(f'{k}: {v}' for k, v in r['counts']['rejected_by_reason'].items()) or 'none'} "
            f"| {_f(s['kv_occupancy_mean'], 0, 100)}% / {_f(s['kv_occupancy_peak'], 0, 100)}% | {s['preemptions']} | "
            f"{s['recomputed_tokens']} | {_f(s['batch_size_mean'], 1)} / {_f(s['batch_size_max'], 0)} | "
            f"{_f(s['iteration_ms_mean'], 1)}"
            for r in runs
            for s in [r["server"]]
        ),
    )


def _tenant_table(runs: list[dict[str, Any]]) -> list[str]:
    return table(
        "workload | tenant | weight | traffic | sent | completed | rejected | charged service (share) | "
        "TTFT p50/p99 ms | completion p99 ms",
        "llrlrrrllr",
        (
            f"{r['workload']} | {name} | {t['weight']:g} | {t['arrival']}, {t['share_of_offered']:.0%} of load"
            f"{' (noisy neighbour)' if t['noisy'] else ''} | {t['sent']} | {t['completed']} | {t['rejected']} | "
            f"{_f(t['charged_service'], 0)} ({_f(t['service_share'], 0, 100)}%) | "
            f"{_pct(t['ttft'], qs=('p50', 'p99'))} | {_f(t['e2e']['p99'], 0, 1e3)}"
            for r in runs
            for name, t in r["tenants"].items()
        ),
    )


def _cancel_lines(runs: list[dict[str, Any]]) -> list[str]:
    return [
        f"- **{r['workload']}**: {c['tasks']} tasks, {c['tasks_with_a_kept_attempt']} kept an attempt; "
        f"{c['attempts_cancel_sent']} attempts were live at the cancel, {c['attempts_cancelled']} ended "
        f"cancelled; cancel to stream end p50/p95/p99 {_pct(c['cancel_to_stream_end_s'])} ms; tokens computed "
        f"after the cancel (server): {c['tokens_computed_after_cancel']} "
        f"({_f(c['tokens_after_cancel_per_cancelled'])} per cancelled attempt)."
        for r in runs
        if (c := r.get("cancellation"))
    ]


def cost_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Cost per verified completion per tenant (bench/report.py), and fan-out waste per task."""
    rows, notes = [], []
    for r in runs:
        cost = r.get("cost_per_outcome") or {"tenants": {}}
        for name, t in cost["tenants"].items():
            per = t["engine_tokens_per_verified"]
            rows.append(
                f"{r['workload']} | {name} | {t['verified_completions']} | {t['engine_tokens']} | "
                f"{'-' if per is None else f'{per:,.0f}'}"
            )
        if (waste := cost.get("wasted_tokens_per_task")) and waste["tasks"]:
            notes.append(
                f"- **{r['workload']}**: wasted engine tokens per task: {waste['cancelled_branches']:,.0f} in "
                f"cancelled branches, {waste['retries']:,.0f} in retries (answers not kept), over "
                f"{waste['tasks']} tasks."
            )
    header = (
        "workload | tenant | verified completions | engine tokens | engine tokens per verified completion"
    )
    return table(header, "llrrr", rows) + (["", *notes] if notes else [])


def _sweep(sweep: dict[str, Any] | None) -> list[str]:
    if not sweep or not sweep.get("points"):
        return []
    cap = sweep.get("capacity")
    rows = (
        f"{_f(p['offered']['requests_per_s'])} | {_f(p['achieved']['requests_per_s'])} | "
        f"{_f(p['achieved']['goodput_requests_per_s'])} | {_f(p['latency_s']['ttft']['p99'], 0, 1e3)} | "
        f"{p['counts']['rejected']}"
        for p in sweep["points"]
    )
    return [
        "## Load sweep through the knee",
        "",
        f"Workload `{sweep['workload']}`, shape fixed, open-loop offered load rising.",
        "",
        *table("offered req/s | achieved req/s | goodput req/s | TTFT p99 ms | rejected", "rrrrr", rows),
        "",
        f"**Useful capacity**: {_f(cap['offered_requests_per_s'])} req/s offered ({cap['rule']})."
        if cap
        else "**Useful capacity**: not reached at the lowest load.",
        "",
    ]


def _engine(eng: dict[str, Any]) -> list[str]:
    lines = ["### Engine: fairserve vs transformers (in-process)", ""]
    if eng.get("rows"):
        lines += [
            f"{eng.get('model')}, {eng.get('requests')} requests, prompts {eng.get('prompt_tokens')} tokens, "
            f"outputs {eng.get('output_tokens')} tokens, {eng.get('sampling')} ({eng.get('mode')}).",
            "",
        ]
        rows = (
            f"{row['system']} | {_f(row['tokens_per_s'], 1)} | "
            + " / ".join(_f(v, 1) for v in row.get("rounds_tokens_per_s", []))
            + " | "
            + (row["verdict"]["text"] if "verdict" in row else "-")
            for row in eng["rows"]
        )
        lines += table("system | output tok/s (median) | each round | fairserve speed-up", "lrll", rows)
        lines += [
            "",
            "A speed-up is given only when its rounds agree within it; otherwise it reads inconclusive, "
            "with the rounds' spread (a busy machine moves single runs several-fold).",
        ]
    return lines + ([f"\n{eng['note']}"] if eng.get("note") else [])


def _policy(pol: dict[str, Any]) -> list[str]:
    lines = ["", "### Policy: one dimension at a time", ""]
    rows = []
    for row in pol.get("rows", []):
        r, lat = row["run"], row["run"]["latency_s"]
        quiet = [t["ttft"]["p99"] or 0.0 for t in r["tenants"].values() if not t["noisy"]]
        noisy = [t["ttft"]["p99"] or 0.0 for t in r["tenants"].values() if t["noisy"]]
        rows.append(
            f"{row['name']} | {row['changed']} | {_f(r['achieved']['requests_per_s'])} | "
            f"{_f(r['achieved']['output_tokens_per_s'], 1)} | {_pct(lat['ttft'], qs=('p50', 'p99'))} | "
            f"{_f(lat['tpot']['p99'], 0, 1e3)} | {_f(r['achieved']['goodput_requests_per_s'])} | "
            f"{_f(max(quiet, default=None), 0, 1e3)} / {_f(max(noisy, default=None), 0, 1e3)}"
        )
    if rows:
        lines += [
            f"Workload `{pol['workload']}` at {pol['rate']} arrivals/s for {pol['duration_s']} s each.",
            "",
        ]
        header = (
            "configuration | changed | achieved req/s | output tok/s | TTFT p50/p99 ms | TPOT p99 ms | "
            "goodput req/s | TTFT p99 ms: quiet tenants / noisy neighbour"
        )
        lines += table(header, "llrrlrrl", rows)
    return lines + ([pol["note"]] if pol.get("note") else [])


def _gateway(gw: dict[str, Any]) -> list[str]:
    lines = ["", "### Gateway: latency added over the in-process engine", ""]
    if "in_process" not in gw:
        return lines + ([gw["note"]] if gw.get("note") else [])
    rows = []
    for name in ("in_process", "fairserve_gateway", "litellm_proxy"):
        r = gw[name]
        cells = [
            f"{_f(r.get(f'{p}{a}_p50_ms'), 1)} / {_f(r.get(f'{p}{a}_p99_ms'), 1)}"
            for p in ("", "added_")
            for a in ("ttft", "e2e")
        ]
        rows.append(f"{name} | " + (" | ".join(cells) if r.get("measured") else f"{r.get('note')} | | |"))
    header = "path | TTFT p50 / p99 ms | completion p50 / p99 ms | added TTFT p50 / p99 ms | added completion p50 / p99 ms"
    return [
        *lines,
        f"{gw['shape']}, {gw['requests']} requests per path at {gw['rate']} req/s (open loop, streaming), "
        f"the paths taking turns in {gw.get('rounds', 1)} rounds.",
        "",
        *table(header, "lllll", rows),
        "",
        *(
            f"Added TTFT p50 of {name}, round by round: {gw[name]['added_ttft_p50_verdict']['text']}."
            for name in ("fairserve_gateway", "litellm_proxy")
            if "added_ttft_p50_verdict" in gw.get(name, {})
        ),
    ]


def _declared(d: dict[str, Any]) -> list[str]:
    keys = ("model", "dtype", "hardware", "server", "engine", "cache_state", "arrivals", "slo_rule")
    rows = (
        f"{w['name']} (rate {w['rate']}/s, fan-out {w['fanout']}) | {w['prompt_tokens']} | {w['output_tokens']} | "
        f"{w['prefix_sharing']['share']:.0%} share a {w['prefix_sharing']['prefix_tokens']}-token prefix | "
        f"T={w['sampling']['temperature']}, {w['sampling']['stop_condition']} | "
        + "; ".join(f"{t['name']} ({t['weight']:g}, {t['arrival']} {t['share']:.0%})" for t in w["tenants"])
        + " | "
        + " / ".join(str(w["slo"][k]) for k in ("ttft_s", "tpot_s", "e2e_s", "deadline_s"))
        for w in d["workloads"]
    )
    header = (
        "workload | prompt tokens | output tokens | prefix sharing | sampling / stop | tenants (weight, traffic) "
        "| SLO TTFT / TPOT / completion / deadline s"
    )
    return [*(f"- **{k}**: {d[k]}" for k in keys), "", *table(header, "lllllll", rows)]


def render(report: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    d, runs, cmp = report["declaration"], report["workloads"], report.get("comparisons", {})
    closed = [report["closed_loop"]] if report.get("closed_loop") else []
    problems = [f"- PROBLEM: {p}" for p in report.get("consistency_problems") or []]
    sections: list[tuple[str, list[str]]] = [
        (f"# fairserve bench ({'quick' if d['quick'] else 'full'})", [f"Command: `{d['command']}`"]),
        ("## Declared", _declared(d)),
        ("## Results", key_table(runs + closed)),
        ("### Server side", _server_table(runs)),
        ("### Tenants", _tenant_table(runs)),
        ("### Cancellation (agent fan-out)", _cancel_lines(runs) or ["- no fan-out workload in this run"]),
        ("### Cost per verified completion", cost_lines(runs)),
    ]
    lines = [line for title, body in sections for line in (title, "", *body, "")]
    lines += [*_sweep(report.get("sweep")), "## Comparisons (same run)", ""]
    lines += [
        *_engine(cmp.get("engine", {})),
        *_policy(cmp.get("policy", {})),
        *_gateway(cmp.get("gateway", {})),
    ]
    lines += ["", "## Plots", "", *(f"![{name}]({path})" for name, path in report.get("plots", {}).items())]
    ok = "- all counts add up, percentiles ordered, goodput <= throughput"
    return "\n".join([*lines, "", "## Consistency", "", *(problems or [ok]), ""])
