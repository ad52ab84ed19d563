"""The Markdown rendering of a bench report: declaration, key table, tenants, sweep, comparisons, plots."""

from __future__ import annotations

from typing import Any

from bench.outcome_cost import cost_lines


def _f(v: Any, digits: int = 2, scale: float = 1.0) -> str:
    if v is None:
        return "-"
    if isinstance(v, int | float):
        return f"{v * scale:.{digits}f}"
    return str(v)


def _pct(p: dict[str, Any], scale: float = 1e3) -> str:
    return " / ".join(_f(p[q], 0, scale) for q in ("p50", "p95", "p99"))


def key_table(runs: list[dict[str, Any]]) -> list[str]:
    """One row per workload: offered vs achieved, counts, latency percentiles, goodput."""
    lines = [
        "| workload | offered req/s (tasks for fan-out) | achieved req/s | output tok/s | sent / accepted / rejected / cancelled / "
        "completed | TTFT p50/p95/p99 ms | TPOT p50/p95/p99 ms | completion p50/p95/p99 ms | SLO goodput req/s "
        "(share) |",
        "|---|---:|---:|---:|---|---|---|---|---|",
    ]
    for r in runs:
        c, a, lat = r["counts"], r["achieved"], r["latency_s"]
        lines.append(
            f"| {r['workload']} ({r['mode']}) | {_f(r['offered']['requests_per_s'])} | {_f(a['requests_per_s'])} | "
            f"{_f(a['output_tokens_per_s'], 1)} | {c['sent']} / {c['accepted']} / {c['rejected']} / {c['cancelled']} / "
            f"{c['completed']} | {_pct(lat['ttft'])} | {_pct(lat['tpot'])} | {_pct(lat['e2e'])} | "
            f"{_f(a['goodput_requests_per_s'])} ({_f(a['goodput_fraction'] * 100, 0)}%) |"
        )
    return lines


def _server_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workload | rejected by reason | KV occupancy mean / peak | preemptions | recomputed tokens | "
        "batch mean / max | iteration ms (mean) |",
        "|---|---|---|---:|---:|---|---:|",
    ]
    for r in runs:
        s = r["server"]
        reasons = ", ".join(f"{k}: {v}" for k, v in r["counts"]["rejected_by_reason"].items()) or "none"
        lines.append(
            f"| {r['workload']} | {reasons} | {_f(s['kv_occupancy_mean'], 0, 100)}% / "
            f"{_f(s['kv_occupancy_peak'], 0, 100)}% | {s['preemptions']} | {s['recomputed_tokens']} | "
            f"{_f(s['batch_size_mean'], 1)} / {_f(s['batch_size_max'], 0)} | {_f(s['iteration_ms_mean'], 1)} |"
        )
    return lines


def _tenant_table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| workload | tenant | weight | traffic | sent | completed | rejected | charged service (share) | "
        "TTFT p50/p99 ms | completion p99 ms |",
        "|---|---|---:|---|---:|---:|---:|---|---|---:|",
    ]
    for r in runs:
        for name, t in r["tenants"].items():
            traffic = f"{t['arrival']}, {t['share_of_offered']:.0%} of load" + (
                " (noisy neighbour)" if t["noisy"] else ""
            )
            lines.append(
                f"| {r['workload']} | {name} | {t['weight']:g} | {traffic} | {t['sent']} | {t['completed']} | "
                f"{t['rejected']} | {_f(t['charged_service'], 0)} ({_f(t['service_share'], 0, 100)}%) | "
                f"{_f(t['ttft']['p50'], 0, 1e3)} / {_f(t['ttft']['p99'], 0, 1e3)} | "
                f"{_f(t['e2e']['p99'], 0, 1e3)} |"
            )
    return lines


def _cancel_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for r in runs:
        c = r.get("cancellation")
        if not c:
            continue
        lag = c["cancel_to_stream_end_s"]
        lines.append(
            f"- **{r['workload']}**: {c['tasks']} tasks, {c['tasks_with_a_kept_attempt']} kept an attempt; "
            f"{c['attempts_cancel_sent']} attempts were live at the cancel, {c['attempts_cancelled']} ended "
            f"cancelled; cancel to stream end p50/p95/p99 {_pct(lag)} ms; tokens computed after the cancel "
            f"(server): {c['tokens_computed_after_cancel']} "
            f"({_f(c['tokens_after_cancel_per_cancelled'])} per cancelled attempt)."
        )
    return lines


def _comparisons(cmp: dict[str, Any]) -> list[str]:
    lines = ["## Comparisons (same run)", ""]
    eng = cmp.get("engine", {})
    lines += ["### Engine: fairserve vs transformers (in-process)", ""]
    if eng.get("rows"):
        lines += [
            f"{eng.get('model')}, {eng.get('requests')} requests, prompts {eng.get('prompt_tokens')} tokens, "
            f"outputs {eng.get('output_tokens')} tokens, {eng.get('sampling')} ({eng.get('mode')}).",
            "",
            "| system | output tok/s | fairserve speed-up |",
            "|---|---:|---:|",
        ]
        for row in eng["rows"]:
            speed = _f(row.get("fairserve_speedup")) + "x" if row.get("fairserve_speedup") else "-"
            lines.append(
                f"| {row['system']} | {_f(row.get('tokens_per_s'), 1) if 'tokens_per_s' in row else row.get('note')} "
                f"| {speed} |"
            )
    if eng.get("note"):
        lines.append(f"\n{eng['note']}")
    lines += ["", "### Policy: one dimension at a time", ""]
    pol = cmp.get("policy", {})
    if pol.get("rows"):
        lines += [
            f"Workload `{pol['workload']}` at {pol['rate']} arrivals/s for {pol['duration_s']} s each.",
            "",
            "| configuration | changed | achieved req/s | output tok/s | TTFT p50/p99 ms | TPOT p99 ms | "
            "goodput req/s | TTFT p99 ms: quiet tenants / noisy neighbour |",
            "|---|---|---:|---:|---|---:|---:|---|",
        ]
        for row in pol["rows"]:
            r = row["run"]
            quiet = max(
                (t["ttft"]["p99"] or 0.0 for t in r["tenants"].values() if not t["noisy"]), default=None
            )
            noisy = max((t["ttft"]["p99"] or 0.0 for t in r["tenants"].values() if t["noisy"]), default=None)
            lines.append(
                f"| {row['name']} | {row['changed']} | {_f(r['achieved']['requests_per_s'])} | "
                f"{_f(r['achieved']['output_tokens_per_s'], 1)} | {_f(r['latency_s']['ttft']['p50'], 0, 1e3)} / "
                f"{_f(r['latency_s']['ttft']['p99'], 0, 1e3)} | {_f(r['latency_s']['tpot']['p99'], 0, 1e3)} | "
                f"{_f(r['achieved']['goodput_requests_per_s'])} | "
                f"{_f(quiet, 0, 1e3)} / {_f(noisy, 0, 1e3)} |"
            )
    if pol.get("note"):
        lines.append(pol["note"])
    lines += ["", "### Gateway: latency added over the in-process engine", ""]
    gw = cmp.get("gateway", {})
    if "in_process" in gw:
        lines += [
            f"{gw['shape']}, {gw['requests']} requests per path at {gw['rate']} req/s (open loop, streaming), "
            f"the paths taking turns in {gw.get('rounds', 1)} rounds.",
            "",
            "| path | TTFT p50 / p99 ms | completion p50 / p99 ms | added TTFT p50 / p99 ms | "
            "added completion p50 / p99 ms |",
            "|---|---|---|---|---|",
        ]
        for name in ("in_process", "fairserve_gateway", "litellm_proxy"):
            r = gw[name]
            if not r.get("measured"):
                lines.append(f"| {name} | {r.get('note')} | | | |")
                continue
            lines.append(
                f"| {name} | {_f(r['ttft_p50_ms'], 1)} / {_f(r['ttft_p99_ms'], 1)} | {_f(r['e2e_p50_ms'], 1)} / "
                f"{_f(r['e2e_p99_ms'], 1)} | {_f(r.get('added_ttft_p50_ms'), 1)} / "
                f"{_f(r.get('added_ttft_p99_ms'), 1)} | {_f(r.get('added_e2e_p50_ms'), 1)} / "
                f"{_f(r.get('added_e2e_p99_ms'), 1)} |"
            )
    elif gw.get("note"):
        lines.append(gw["note"])
    return lines


def render(report: dict[str, Any]) -> str:
    """The whole report as Markdown."""
    d = report["declaration"]
    runs = report["workloads"]
    lines = [
        f"# fairserve bench ({'quick' if d['quick'] else 'full'})",
        "",
        f"Command: `{d['command']}`",
        "",
        "## Declared",
        "",
    ]
    for k in ("model", "dtype", "hardware", "server", "engine", "cache_state", "arrivals", "slo_rule"):
        lines.append(f"- **{k}**: {d[k]}")
    lines += [
        "",
        "| workload | prompt tokens | output tokens | prefix sharing | sampling / stop | tenants (weight, "
        "traffic) | SLO TTFT / TPOT / completion / deadline s |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in d["workloads"]:
        ten = "; ".join(
            f"{t['name']} ({t['weight']:g}, {t['arrival']} {t['share']:.0%})" for t in w["tenants"]
        )
        slo = w["slo"]
        lines.append(
            f"| {w['name']} (rate {w['rate']}/s, fan-out {w['fanout']}) | {w['prompt_tokens']} | "
            f"{w['output_tokens']} | {w['prefix_sharing']['share']:.0%} share a "
            f"{w['prefix_sharing']['prefix_tokens']}-token prefix | T={w['sampling']['temperature']}, "
            f"{w['sampling']['stop_condition']} | {ten} | {slo['ttft_s']} / {slo['tpot_s']} / {slo['e2e_s']} / "
            f"{slo['deadline_s']} |"
        )
    lines += [
        "",
        "## Results",
        "",
        *key_table(runs + ([report["closed_loop"]] if report.get("closed_loop") else [])),
        "",
        "### Server side",
        "",
        *_server_table(runs),
        "",
        "### Tenants",
        "",
        *_tenant_table(runs),
        "",
        "### Cancellation (agent fan-out)",
        "",
        *(_cancel_lines(runs) or ["- no fan-out workload in this run"]),
        "",
        "### Cost per verified completion",
        "",
        *cost_lines(runs),
        "",
    ]
    sweep = report.get("sweep")
    if sweep and sweep.get("points"):
        cap = sweep.get("capacity")
        lines += [
            "## Load sweep through the knee",
            "",
            f"Workload `{sweep['workload']}`, shape fixed, open-loop offered load rising.",
            "",
            "| offered req/s | achieved req/s | goodput req/s | TTFT p99 ms | rejected |",
            "|---:|---:|---:|---:|---:|",
        ]
        for p in sweep["points"]:
            lines.append(
                f"| {_f(p['offered']['requests_per_s'])} | {_f(p['achieved']['requests_per_s'])} | "
                f"{_f(p['achieved']['goodput_requests_per_s'])} | {_f(p['latency_s']['ttft']['p99'], 0, 1e3)} | "
                f"{p['counts']['rejected']} |"
            )
        lines += [
            "",
            f"**Useful capacity**: {_f(cap['offered_requests_per_s'])} req/s offered ({cap['rule']})."
            if cap
            else "**Useful capacity**: not reached at the lowest load.",
            "",
        ]
    lines += _comparisons(report.get("comparisons", {}))
    lines += ["", "## Plots", ""] + [f"![{name}]({path})" for name, path in report.get("plots", {}).items()]
    problems = report.get("consistency_problems") or []
    lines += [
        "",
        "## Consistency",
        "",
        "- all counts add up, percentiles ordered, goodput <= throughput"
        if not problems
        else "\n".join(f"- PROBLEM: {p}" for p in problems),
        "",
    ]
    return "\n".join(lines)
