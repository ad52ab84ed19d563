"""`fairserve bench`: run the workloads, the knee sweep and the comparisons, then write JSON, Markdown, PNG."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import httpx
import torch
from tqdm import tqdm

from bench import comparisons, markdown, plots
from bench.cli import BenchOptions
from bench.harness import served_model
from bench.loadgen import Target, run_load
from bench.probe import Timeline, sample, scrape, settled
from bench.provision import provision_tenants
from bench.report import capacity_point, consistency_problems, summarise
from bench.server import LocalServer, start_local_server
from bench.workloads import WORKLOADS, Workload, plan
from engine import EngineConfig
from engine.worker.loader import DEFAULT_MODEL_VERSION
from fairness import FairnessConfig


async def measure(
    target: Target, workload: Workload, rate: float, duration_s: float, seed: int, closed_clients: int = 0
) -> dict[str, Any]:
    """One run of a workload at one rate: metrics before, sampled during, settled after; summarised."""
    # A closed loop sends as fast as its clients get answers: give it more requests than it can use.
    planned = plan(workload, max(rate, 100.0) if closed_clients else rate, duration_s, seed)
    headers = target.metrics_headers()
    async with httpx.AsyncClient(base_url=target.url, timeout=10.0, headers=headers) as client:
        before, timeline, stop = await scrape(client), Timeline(), asyncio.Event()
        sampling = asyncio.create_task(sample(client, timeline, stop))
        desc = f"{workload.name} @ {rate:g}/s" + (" closed" if closed_clients else "")
        with tqdm(total=len(planned), desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
            result = await run_load(target, workload, planned, bar.update, closed_clients, duration_s)
        stop.set()
        await sampling
        after = await settled(client, before, sum(1 for o in result.outcomes if o.accepted))
    mode = f"closed loop, {closed_clients} clients (comparison only)" if closed_clients else "open loop"
    section = summarise(workload, planned, rate, duration_s, result, before, after, timeline, mode)
    if closed_clients:  # a closed loop sends only what its clients get through, not the plan
        section["rate"] = section["counts"]["sent"] / max(section["window_s"], 1e-9)
        section["offered"].update(requests_per_s=section["rate"], http_requests_per_s=section["rate"])
    section["slo"] = asdict(workload.slo)
    section["consistency_problems"] = consistency_problems(section)
    return section


def declaration(opts: BenchOptions, target: Target, local: LocalServer | None) -> dict[str, Any]:
    """What the essay asks every benchmark to declare (the per-workload part comes from the workloads)."""
    cfg = local.engine.config if local else None
    accelerator = f"CUDA {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no accelerator"
    cpu = " ".join(filter(None, (platform.machine(), platform.processor())))
    embedded = cfg is not None and cfg.model is None
    server = "self-started: uvicorn on a thread of the bench process, 127.0.0.1, SQLite in a temp dir"
    return {
        "command": opts.command,
        "quick": opts.quick,
        "model": target.model
        + (f" (revision {DEFAULT_MODEL_VERSION}, embedded, seeded random weights)" if embedded else ""),
        "dtype": (cfg.dtype if cfg else "server's")
        + (" (the embedded model is float32)" if cfg and cfg.dtype == "auto" else ""),
        "hardware": f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        + accelerator,
        "server": server
        if local
        else f"remote {target.url}; "
        + (
            "each tenant its own key and weight (bench-NAME, set through the admin API)"
            if target.keys
            else "every tenant uses the given key (no --admin-token: one tenant, one weight)"
        ),
        "engine": cfg.model_dump(exclude={"cache_dir", "trace_path"})
        if cfg
        else "remote server (its configuration is the server's; see its /admin/api/engine)",
        "cache_state": "warm model and kernels (one warm-up burst first); prefix cache cold at the start of each "
        "workload's own prefix, then warm as its shared prefix repeats",
        "arrivals": f"open loop, {opts.duration_s:g} s per workload at each workload's rate x{opts.rate_scale:g}; "
        "per-tenant Poisson or on/off bursts (on 0.5 s, off 1.5 s, same mean rate)",
        "slo_rule": "a request is good when it completed and met its workload's TTFT, TPOT and completion objectives",
        "workloads": [
            WORKLOADS[n].declare() | {"rate": WORKLOADS[n].default_rate * opts.rate_scale}
            for n in opts.workloads
        ],
    }


def _target(server: LocalServer) -> Target:
    return Target(server.url, server.model, server.keys, metrics_token=server.state.metrics_token)


async def _policy_rows(opts: BenchOptions, local: LocalServer | None, tmp: Path) -> dict[str, Any]:
    """The policy workload on the baseline engine, then with one dimension changed at a time."""
    if local is None:
        return {"note": "not measured: changing the engine configuration needs the self-started server"}
    workload, rate = WORKLOADS[opts.policy_workload], opts.policy_rate * opts.rate_scale
    tenants = [(t.name, t.weight) for t in workload.tenants]
    rows = []
    for i, (name, changed, cfg) in enumerate(comparisons.policy_variants(local.engine.config)):
        server = local
        if i:
            server = await asyncio.to_thread(start_local_server, cfg, tmp / f"policy-{i}", tenants)
        try:
            run = await measure(_target(server), workload, rate, opts.duration_s, opts.seed)
            rows.append({"name": name, "changed": changed, "run": run})
        finally:
            if server is not local:
                await asyncio.to_thread(server.stop)
    return {"workload": workload.name, "rate": rate, "duration_s": opts.duration_s, "rows": rows}


async def bench_async(
    opts: BenchOptions, target: Target, local: LocalServer | None, tmp: Path
) -> dict[str, Any]:
    """Every phase against a running server; the report as a dict (without plots)."""
    report: dict[str, Any] = {"declaration": declaration(opts, target, local)}
    started = time.perf_counter()
    phases: dict[str, float] = {}

    def lap(name: str) -> None:
        phases[name] = time.perf_counter() - started - sum(phases.values())

    chat = WORKLOADS["chat"]
    warm = replace(chat, slo=replace(chat.slo, deadline_s=None))
    await run_load(target, warm, plan(warm, 8.0, 1.0, seed=opts.seed + 999))
    rate = {n: WORKLOADS[n].default_rate * opts.rate_scale for n in WORKLOADS}
    report["workloads"] = [
        await measure(target, WORKLOADS[n], rate[n], opts.duration_s, opts.seed) for n in opts.workloads
    ]
    lap("workloads")
    clients = opts.closed_loop_clients
    report["closed_loop"] = await measure(target, chat, rate["chat"], opts.duration_s, opts.seed, clients)
    lap("closed_loop")
    sweep_w = WORKLOADS[opts.sweep_workload]
    points = [await measure(target, sweep_w, r, opts.sweep_duration_s, opts.seed) for r in opts.sweep_rates]
    for p in points:
        p.pop("timeline", None)
    report["sweep"] = {"workload": sweep_w.name, "points": points, "capacity": capacity_point(points)}
    lap("sweep")
    off = {"note": "not measured: comparisons switched off (--no-comparisons)"}
    cmp: dict[str, Any] = {k: off for k in ("engine", "policy", "gateway")}
    if opts.comparisons:
        n = 32 if opts.quick else 240
        cmp["gateway"] = await comparisons.gateway_comparison(local, 8.0, n, opts.litellm_bin)
        lap("gateway_comparison")
        cmp["policy"] = await _policy_rows(opts, local, tmp)
        lap("policy_comparison")
        cache = str(tmp / "models") if local else tempfile.mkdtemp()
        cmp["engine"] = await asyncio.to_thread(comparisons.engine_comparison, cache, opts.quick)
    lap("engine_comparison")
    report |= {"comparisons": cmp, "phases_s": phases, "elapsed_s": time.perf_counter() - started}
    return report


def write_outputs(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """report.json, report.md and the PNGs under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    runs, sweep = report["workloads"], report["sweep"]
    pngs = {
        "timeline": plots.timeline(runs, out / "bench_timeline.png"),
        "latency": plots.latency(runs, out / "bench_latency.png"),
        "knee": plots.knee(sweep["points"], sweep["capacity"], out / "bench_knee.png"),
        "tenants": plots.tenants(runs, out / "bench_tenants.png", report["declaration"]["engine"]),
    }
    report["plots"] = {k: p.name for k, p in pngs.items()}
    sections = [*runs, report["closed_loop"], *sweep["points"]]
    sections += [row["run"] for row in report["comparisons"].get("policy", {}).get("rows", [])]
    report["consistency_problems"] = [
        f"{s['workload']} @ {s['rate']:g}: {p}" for s in sections for p in s["consistency_problems"]
    ]
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown.render(report))
    return {"json": out / "report.json", "markdown": out / "report.md", **pngs}


def _bench_tenants(opts: BenchOptions) -> list[tuple[str, float]]:
    """(name, weight) of every tenant the chosen workloads (and the warm-up's chat) send as."""
    return sorted({(t.name, t.weight) for n in {*opts.workloads, "chat"} for t in WORKLOADS[n].tenants})


def _remote(opts: BenchOptions) -> Target:
    """The --url server as a target: its first model; with --admin-token a key per bench tenant, each
    tenant with its workload's weight (bench/provision.py), else every tenant on the one --api-key."""
    assert opts.url is not None
    url = opts.url.rstrip("/")
    keys = provision_tenants(url, opts.admin_token, _bench_tenants(opts)) if opts.admin_token else {}
    default = opts.api_key or next(iter(keys.values()))
    return Target(url, served_model(url, default), keys, default, metrics_token=opts.metrics_token)


def run_bench(opts: BenchOptions) -> dict[str, Path]:
    """Run everything (starting a server unless `opts.url` is set) and write the report."""
    opts.validate()
    with tempfile.TemporaryDirectory(prefix="fairserve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        local: LocalServer | None = None
        if opts.url is None:
            tenants = _bench_tenants(opts)
            # The embedded model under VTC, a token budget that chunks long prompts, few KV blocks so occupancy shows.
            config = EngineConfig(
                cache_dir=str(tmp / "models"),
                max_num_batched_tokens=256,
                num_kv_blocks=384,
                fairness=FairnessConfig(policy="vtc"),
            )
            local = start_local_server(config, tmp / "data", tenants)
        try:
            target = _target(local) if local else _remote(opts)
            report = asyncio.run(bench_async(opts, target, local, tmp))
        finally:
            if local is not None:
                local.stop()
        return write_outputs(report, opts.out)
