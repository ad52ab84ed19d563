"""`fairserve bench`: run the workloads, the knee sweep and the comparisons, then write JSON, Markdown, PNG."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import torch
from tqdm import tqdm

from bench import comparisons, markdown, plots
from bench.loadgen import LoadResult, Target, run_closed_loop, run_open_loop
from bench.probe import Sampler, scrape, settled
from bench.report import capacity_point, consistency_problems, summarise
from bench.server import LocalServer, start_local_server
from bench.workloads import WORKLOADS, Workload, plan
from engine import EngineConfig
from engine.loader import DEFAULT_MODEL_VERSION
from fairness import FairnessConfig


@dataclass
class BenchOptions:
    """Everything one `fairserve bench` invocation does; defaults are the full run."""

    url: str | None = None
    api_key: str | None = None
    metrics_token: str = ""  # with --url: the server's metrics (or admin) token, for /metrics
    quick: bool = False
    out: Path = Path("bench-report")
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    seed: int = 0
    duration_s: float = 20.0
    rate_scale: float = 1.0  # multiplies every workload's default arrival rate
    sweep_rates: list[float] = field(default_factory=lambda: [4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0])
    sweep_duration_s: float = 10.0
    sweep_workload: str = "chat"
    policy_workload: str = "retrieval"
    policy_rate: float = 16.0  # arrivals/s: busy enough that ordering and chunking matter
    closed_loop_clients: int = 4
    comparisons: bool = True
    litellm_bin: str | None = None
    command: str = "fairserve bench"

    @classmethod
    def quick_defaults(cls, **overrides: Any) -> BenchOptions:
        """The `--quick` sizing: the whole run fits in under two minutes on a 2-core machine."""
        base = cls(quick=True, duration_s=4.0, sweep_rates=[4.0, 16.0, 32.0, 64.0], sweep_duration_s=2.5)
        return replace(base, **overrides)

    def validate(self) -> None:
        """Raise ValueError naming the first bad option."""
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workload {unknown[0]!r}; choose from {', '.join(WORKLOADS)}")
        if self.duration_s <= 0 or self.sweep_duration_s <= 0:
            raise ValueError("durations must be > 0")
        if self.rate_scale <= 0 or any(r <= 0 for r in self.sweep_rates):
            raise ValueError("rates must be > 0")
        if self.url is not None and not self.api_key:
            raise ValueError("--url needs --api-key")


def bench_engine_config(cache_dir: str) -> EngineConfig:
    """The self-started server's engine: embedded model, VTC, a token budget that chunks long prompts, 384 KV blocks so occupancy shows."""
    return EngineConfig(
        cache_dir=cache_dir,
        max_num_batched_tokens=256,
        num_kv_blocks=384,
        fairness=FairnessConfig(policy="vtc"),
    )


def _progress(desc: str, total: int) -> tuple[tqdm, Callable[[], None]]:
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
    return bar, lambda: bar.update(1)


async def measure(
    target: Target, workload: Workload, rate: float, duration_s: float, seed: int, closed_clients: int = 0
) -> dict[str, Any]:
    """One run of a workload at one rate: metrics before, sampled during, settled after; summarised."""
    # A closed loop sends as fast as its clients get answers: give it more requests than it can use.
    planned = plan(workload, max(rate, 100.0) if closed_clients else rate, duration_s, seed)
    async with httpx.AsyncClient(
        base_url=target.url, timeout=10.0, headers=target.metrics_headers()
    ) as client:
        before = await scrape(client)
        sampler = Sampler(target.url, headers=target.metrics_headers())
        sampler.start()
        bar, tick = _progress(
            f"{workload.name} @ {rate:g}/s" + (" closed" if closed_clients else ""), len(planned)
        )
        try:
            if closed_clients:
                result: LoadResult = await run_closed_loop(
                    target, workload, planned, closed_clients, duration_s, tick
                )
            else:
                result = await run_open_loop(target, workload, planned, tick)
        finally:
            bar.close()
        timeline = await sampler.stop()
        accepted = sum(1 for o in result.outcomes if o.accepted)
        after = await settled(client, before, accepted)
    mode = f"closed loop, {closed_clients} clients (comparison only)" if closed_clients else "open loop"
    section = summarise(workload, planned, rate, duration_s, result, before, after, timeline, mode)
    if closed_clients:  # a closed loop sends only what its clients get through, not the plan
        sent_rate = section["counts"]["sent"] / max(section["window_s"], 1e-9)
        section["offered"].update(requests_per_s=sent_rate, http_requests_per_s=sent_rate)
        section["rate"] = sent_rate
    section["slo"] = asdict(workload.slo)
    section["consistency_problems"] = consistency_problems(section)
    return section


def declaration(opts: BenchOptions, target: Target, local: LocalServer | None) -> dict[str, Any]:
    """What the essay asks every benchmark to declare (the per-workload part comes from the workloads)."""
    cfg = local.engine.config if local else None
    engine = (
        {k: v for k, v in cfg.model_dump().items() if k not in ("cache_dir", "trace_path")}
        if cfg
        else "remote server (its configuration is the server's; see its /admin/api/engine)"
    )
    return {
        "command": opts.command,
        "quick": opts.quick,
        "model": target.model
        + (
            f" (revision {DEFAULT_MODEL_VERSION}, embedded, seeded random weights)"
            if cfg and cfg.model is None
            else ""
        ),
        "dtype": (cfg.dtype if cfg else "server's")
        + (" (the embedded model is float32)" if cfg and cfg.dtype == "auto" else ""),
        "hardware": f"{platform.machine()}{' ' + platform.processor() if platform.processor() else ''}, "
        f"{os.cpu_count()} CPUs, torch "
        f"{torch.__version__} ({torch.get_num_threads()} threads), "
        f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no accelerator'}",
        "server": (
            "self-started: uvicorn on a thread of the bench process, 127.0.0.1, SQLite in a temp dir"
            if local
            else f"remote {target.url}; every tenant uses the given key"
        ),
        "engine": engine,
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


async def _policy_rows(opts: BenchOptions, local: LocalServer | None, tmp: Path) -> dict[str, Any]:
    if local is None:
        return {"note": "not measured: changing the engine configuration needs the self-started server"}
    workload = WORKLOADS[opts.policy_workload]
    rate = opts.policy_rate * opts.rate_scale
    rows = []
    for i, (name, changed, cfg) in enumerate(comparisons.policy_variants(local.engine.config)):
        server = (
            local
            if i == 0
            else await asyncio.to_thread(
                start_local_server, cfg, tmp / f"policy-{i}", [(t.name, t.weight) for t in workload.tenants]
            )
        )
        try:
            target = Target(server.url, server.model, server.keys, metrics_token=server.state.metrics_token)
            rows.append(
                {
                    "name": name,
                    "changed": changed,
                    "run": await measure(target, workload, rate, opts.duration_s, opts.seed),
                }
            )
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

    warm = replace(WORKLOADS["chat"], slo=replace(WORKLOADS["chat"].slo, deadline_s=None))
    await run_open_loop(target, warm, plan(warm, 8.0, 1.0, seed=opts.seed + 999))
    report["workloads"] = [
        await measure(
            target, WORKLOADS[n], WORKLOADS[n].default_rate * opts.rate_scale, opts.duration_s, opts.seed
        )
        for n in opts.workloads
    ]
    lap("workloads")
    chat = WORKLOADS["chat"]
    report["closed_loop"] = await measure(
        target,
        chat,
        chat.default_rate * opts.rate_scale,
        opts.duration_s,
        opts.seed,
        closed_clients=opts.closed_loop_clients,
    )
    lap("closed_loop")
    sweep_w = WORKLOADS[opts.sweep_workload]
    points = [await measure(target, sweep_w, r, opts.sweep_duration_s, opts.seed) for r in opts.sweep_rates]
    for p in points:
        p.pop("timeline", None)
    report["sweep"] = {"workload": sweep_w.name, "points": points, "capacity": capacity_point(points)}
    lap("sweep")
    cmp: dict[str, Any] = {}
    if opts.comparisons:
        n = 32 if opts.quick else 240
        cmp["gateway"] = await comparisons.gateway_comparison(local, 8.0, n, opts.litellm_bin)
        lap("gateway_comparison")
        cmp["policy"] = await _policy_rows(opts, local, tmp)
        lap("policy_comparison")
        cmp["engine"] = await asyncio.to_thread(
            comparisons.engine_comparison, str(tmp / "models") if local else tempfile.mkdtemp(), opts.quick
        )
    else:
        cmp = {
            k: {"note": "not measured: comparisons switched off (--no-comparisons)"}
            for k in ("engine", "policy", "gateway")
        }
    lap("engine_comparison")
    report["comparisons"] = cmp
    report["phases_s"] = phases
    report["elapsed_s"] = time.perf_counter() - started
    return report


def write_outputs(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """report.json, report.md and the PNGs under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    pngs = {
        "timeline": plots.timeline(report["workloads"], out / "bench_timeline.png"),
        "latency": plots.latency(report["workloads"], out / "bench_latency.png"),
        "knee": plots.knee(report["sweep"]["points"], report["sweep"]["capacity"], out / "bench_knee.png"),
        "tenants": plots.tenants(
            report["workloads"], out / "bench_tenants.png", report["declaration"]["engine"]
        ),
    }
    report["plots"] = {k: p.name for k, p in pngs.items()}
    sections = [*report["workloads"], report["closed_loop"], *report["sweep"]["points"]]
    sections += [row["run"] for row in report["comparisons"].get("policy", {}).get("rows", [])]
    report["consistency_problems"] = [
        f"{s['workload']} @ {s['rate']:g}: {p}" for s in sections for p in s["consistency_problems"]
    ]
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(markdown.render(report))
    return {"json": out / "report.json", "markdown": out / "report.md", **pngs}


def run_bench(opts: BenchOptions) -> dict[str, Path]:
    """Run everything (starting a server unless `opts.url` is set) and write the report."""
    opts.validate()
    with tempfile.TemporaryDirectory(prefix="fairserve-bench-") as tmp_name:
        tmp = Path(tmp_name)
        local: LocalServer | None = None
        if opts.url is None:
            tenants = {(t.name, t.weight) for n in opts.workloads for t in WORKLOADS[n].tenants}
            tenants |= {(t.name, t.weight) for t in WORKLOADS["chat"].tenants}
            local = start_local_server(
                bench_engine_config(str(tmp / "models")), tmp / "data", sorted(tenants)
            )
            target = Target(local.url, local.model, local.keys, metrics_token=local.state.metrics_token)
        else:
            assert opts.api_key is not None
            models = httpx.get(
                f"{opts.url.rstrip('/')}/v1/models",
                timeout=10.0,
                headers={"Authorization": f"Bearer {opts.api_key}"},
            )
            models.raise_for_status()
            target = Target(
                opts.url.rstrip("/"),
                models.json()["data"][0]["id"],
                {},
                opts.api_key,
                metrics_token=opts.metrics_token,
            )
        try:
            report = asyncio.run(bench_async(opts, target, local, tmp))
        finally:
            if local is not None:
                local.stop()
        return write_outputs(report, opts.out)
