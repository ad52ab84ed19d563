"""Comparisons measured in the same run, as ratios to a peer of this run: engine vs transformers, one
policy dimension at a time, the gateway vs the in-process engine and litellm.

The sides of a comparison take turns, round by round, and each round's result is kept: a ratio or an
added latency is reported only when the rounds agree within the effect, else "inconclusive" with the
rounds' spread (bench/verdict.py)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.litellm_peer import LiteLLMProxy, find_litellm
from bench.loadgen import Outcome, Target, run_load
from bench.report import percentiles
from bench.server import LocalServer
from bench.verdict import difference_verdict, ratio_verdict
from bench.workloads import SLO, LengthDist, PlannedRequest, Workload
from engine import AsyncEngine, EngineConfig, ProcessEngine, RequestMeta, SamplingParams

PROBE = Workload(
    "probe",
    "fixed-rate latency probe: 32-token prompt, 8 output tokens",
    prompt=LengthDist(32, 32),
    output=LengthDist(8, 8),
    slo=SLO(1.0, 0.25, 5.0),
    tenants=(),
)


def not_measured(reason: str) -> dict[str, Any]:
    """A row that says plainly why it is missing."""
    return {"measured": False, "note": f"not measured: {reason}"}


def _fixed_rate_plan(rate: float, n: int) -> list[PlannedRequest]:
    prompt = ("the batch never waits " * 4)[:32]
    return [PlannedRequest(i / rate, "bench", prompt, [8], seeds=[i]) for i in range(n)]


def _lat(outcomes: list[Outcome]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.accepted and o.finish_reason in ("length", "stop")]
    row: dict[str, Any] = {"measured": True, "n": len(ok), "failed": len(outcomes) - len(ok)}
    for name in ("ttft", "e2e"):
        p = percentiles([v for o in ok if (v := getattr(o, name)) is not None])
        row |= {f"{name}_{q}_ms": None if (v := p[q]) is None else v * 1e3 for q in ("p50", "p99")}
    return row


async def _inproc(engine: AsyncEngine | ProcessEngine, plan: list[PlannedRequest]) -> list[Outcome]:
    """The same plan sent straight to AsyncEngine.generate, tokenising like the gateway does."""
    t0 = time.perf_counter()

    async def one(i: int, req: PlannedRequest) -> Outcome:
        await asyncio.sleep(max(0.0, t0 + req.at - time.perf_counter()))
        out = Outcome(f"inproc-{time.time_ns()}-{i}", "bench", time.perf_counter() - t0, status=200)
        ids = engine.tokenizer.encode(req.prompt)
        params = SamplingParams(max_tokens=req.max_tokens[0], temperature=0.0, ignore_eos=True)
        async for o in engine.generate(ids, params, RequestMeta(tenant_id="bench-inproc"), out.request_id):
            if o.new_token_ids and out.first_token_at is None:
                out.first_token_at = time.perf_counter() - t0
            if o.finished:
                out.finish_reason = o.finish_reason.value if o.finish_reason else None
                out.completion_tokens = o.metrics.completion_tokens
        out.end_at = time.perf_counter() - t0
        return out

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(plan))))


async def _via(target: Target, plan: list[PlannedRequest]) -> list[Outcome]:
    return (await run_load(target, PROBE, plan)).outcomes


async def gateway_comparison(
    local: LocalServer | None, rate: float, n: int, litellm_bin: str | None, rounds: int = 3
) -> dict[str, Any]:
    """p50/p99 at one offered load: in-process engine, through fairserve's gateway, through litellm in front;
    the paths take turns for `rounds` rounds, so background load on a shared machine hits them alike."""
    if local is None:
        return {"note": "not measured: needs the self-started server (the bench must own the engine)"}
    per_round, key = max(1, n // rounds), next(iter(local.keys.values()))
    plan, target = _fixed_rate_plan(rate, per_round), Target(local.url, local.model, {}, key)
    rows: dict[str, Any] = {"rate": rate, "requests": per_round * rounds, "rounds": rounds}
    rows["shape"] = PROBE.description
    paths: dict[str, Callable[[list[PlannedRequest]], Awaitable[list[Outcome]]]] = {
        "in_process": lambda p: _inproc(local.engine, p),
        "fairserve_gateway": lambda p: _via(target, p),
    }
    proxy: LiteLLMProxy | None = None
    binary = find_litellm(litellm_bin)
    if binary is None:
        rows["litellm_proxy"] = not_measured(
            "litellm is not installed (pip install -e '.[bench]', or pass --litellm-bin / FAIRSERVE_LITELLM_BIN)"
        )
    else:
        try:
            proxy = await asyncio.to_thread(LiteLLMProxy, binary, local.url, key, local.model)
        except (RuntimeError, OSError) as exc:
            rows["litellm_proxy"] = not_measured(f"litellm proxy did not start: {exc}")
        else:
            ll = Target(proxy.url, local.model, {}, proxy.master_key)
            paths["litellm_proxy"] = lambda p: _via(ll, p)
    by_round: list[dict[str, dict[str, Any]]] = []
    try:
        collected: dict[str, list[Outcome]] = {name: [] for name in paths}
        for run in paths.values():
            await run(_fixed_rate_plan(rate, min(n, 10)))  # warm-up
        for _ in range(rounds):
            this_round: dict[str, dict[str, Any]] = {}
            for name, run in paths.items():
                outcomes = await run(plan)
                collected[name] += outcomes
                this_round[name] = _lat(outcomes)
            by_round.append(this_round)
        rows.update({name: _lat(outs) for name, outs in collected.items()})
    finally:
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
    base = rows["in_process"]
    for name in ("fairserve_gateway", "litellm_proxy"):
        r = rows[name]
        if r.get("measured") and r["n"] and base["n"]:
            r |= {
                f"added_{k}": r[k] - base[k]
                for k in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
            }
            # Each round's own added p50 TTFT: the paths alternated, so a busy spell hits one round, not one path.
            added = [
                rnd[name]["ttft_p50_ms"] - rnd["in_process"]["ttft_p50_ms"]
                for rnd in by_round
                if rnd[name]["ttft_p50_ms"] is not None and rnd["in_process"]["ttft_p50_ms"] is not None
            ]
            r["added_ttft_p50_verdict"] = difference_verdict(added)
    return rows


def policy_variants(base: EngineConfig) -> list[tuple[str, str, EngineConfig]]:
    """(name, the one dimension changed, config): a baseline, then one change at a time."""
    fields = base.model_dump()
    fcfs = EngineConfig.model_validate({**fields, "fairness": {**fields["fairness"], "policy": "fcfs"}})
    # "Off" = a token budget that covers any prompt, so every prefill runs whole in one iteration.
    unchunked = EngineConfig.model_validate({**fields, "max_num_batched_tokens": 2048})
    return [
        (f"baseline: vtc, chunked prefill (budget {base.max_num_batched_tokens})", "-", base),
        ("fcfs instead of vtc", "policy", fcfs),
        ("chunked prefill off (budget 2048 >= any prompt)", "chunked prefill", unchunked),
    ]


def engine_comparison(cache_dir: str, quick: bool) -> dict[str, Any]:
    """fairserve LLM.generate vs transformers generate() and generate_batch(), with bench.engine_throughput's runners.

    generate_batch() is bounded to fairserve's token budget and ample blocks: left to size itself on CPU it
    takes most of the RAM (14.7 GB here, OOM-killed next to the server).
    """
    from bench import engine_throughput as et
    from engine.worker.loader import default_model_dir

    n, prompts, outputs, repeats = (12, (8, 64), (4, 32), 3) if quick else (48, (8, 256), (8, 128), 3)
    header = {
        "model": "embedded default (fairserve-tiny, fp32)",
        "requests": n,
        "prompt_tokens": list(prompts),
        "output_tokens": list(outputs),
        "sampling": "greedy, EOS ignored",
        "mode": ("reduced" if quick else "full")
        + f", median of {repeats} alternating rounds after a warm-up",
    }
    try:
        systems = ["fairserve", "generate", "generate_batch"]
        runs, _ = et.runners(Path(default_model_dir(cache_dir)), systems, 8, (64, 512), (4 * n, 512))
        workload, warmup = et.make_workload(n, prompts, outputs, 0), et.make_workload(4, (4, 16), (2, 4), 1)
        rounds = _alternating_rounds(runs, workload, warmup, repeats)
    except Exception as exc:  # a peer's API or install problem must not sink the whole report
        return {**header, "rows": [], "note": f"not measured: {type(exc).__name__}: {str(exc)[:200]}"}
    rows: list[dict[str, Any]] = [
        {
            "system": system,
            "tokens_per_s": statistics.median(r[system] for r in rounds),
            "rounds_tokens_per_s": [r[system] for r in rounds],
        }
        for system in runs  # the runners' display names, fairserve's first
    ]
    for row in rows[1:]:
        # Each round's ratio: the systems ran back to back in it, so load on the machine hit both alike.
        verdict = ratio_verdict([r["fairserve"] / r[row["system"]] for r in rounds])
        row["verdict"] = verdict
        if verdict["conclusive"]:
            row["fairserve_speedup"] = verdict["median"]
    return {**header, "rows": rows}


def _alternating_rounds(
    runs: dict[str, Any], workload: Any, warmup: Any, repeats: int
) -> list[dict[str, float]]:
    """Warm every system up, then `repeats` rounds of every system in turn: each round's tokens/s by system."""
    for run in runs.values():
        run(warmup)
    rounds = []
    for _ in range(repeats):
        this_round = {}
        for system, run in runs.items():
            start = time.perf_counter()
            tokens = run(workload)
            this_round[system] = tokens / (time.perf_counter() - start)
        rounds.append(this_round)
    return rounds
