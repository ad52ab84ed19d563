"""`fairserve bench --deadlines`: tight, mixed deadlines over a fast and a slow model under the `reject`,
`fallback` and `partial` policies of X-On-Infeasible, in one run (docs/bench.md, "Deadlines").

One gateway serves both models (`--fallback-model slow=fast`); the same open-loop plan (every request for
`slow`) runs once per policy, policies in turn, for `rounds` rounds. Each answer is verified against what
its status, headers and body claim (`verdict`), and is good only within its deadline. SLO goodput is good
answers per second of offered traffic.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from bench import harness
from bench.server import serve_on_thread
from engine.core.byte_tokenizer import BYTE_SPECIAL_TOKENS
from engine.worker.loader import default_model_config, write_seeded_llama

# The two models: `fast` is smaller than the default model, `slow` larger (tests/gateway/test_models.py too).
TWO_MODELS: dict[str, dict[str, int]] = {
    "fast": {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 1, "head_dim": 16,
             "num_attention_heads": 4, "num_key_value_heads": 2},
    "slow": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "head_dim": 64,
             "num_attention_heads": 12, "num_key_value_heads": 4},
}  # fmt: skip
POLICIES = ("reject", "fallback", "partial")
DEADLINES_MS = (1000, 2000, 4000, 8000)  # the mix each request draws from: `slow` alone needs 1-4 s here
OUTCOMES = ("full", "fallback", "partial", "rejected", "missed", "error")
GOOD = ("full", "fallback", "partial")


def build_model(root: Path, name: str) -> Path:
    """Write model `name` (fast or slow) into root/name once; its directory name is its served name."""
    target = root / name
    if not (target / "model.safetensors").is_file():
        write_seeded_llama(target, default_model_config(256 + len(BYTE_SPECIAL_TOKENS)) | TWO_MODELS[name])
    return target


def plan(rate: float, duration_s: float, seed: int) -> list[dict[str, Any]]:
    """Arrival offsets, prompt length, max_tokens and deadline of each request (the same for every policy)."""
    rng = random.Random(seed)
    t, out = 0.0, list[dict[str, Any]]()
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        out.append({"at": t, "prompt": rng.randint(16, 96), "max_tokens": rng.randint(16, 64),
                    "deadline_ms": rng.choice(DEADLINES_MS)})  # fmt: skip


def verdict(resp: httpx.Response | None, req: dict[str, Any], elapsed_s: float) -> str:
    """The outcome of one answer, checked against what its status, headers and body claim."""
    if resp is None:
        return "error"
    if resp.status_code == 503:
        return "rejected" if resp.headers.get("retry-after") else "error"
    if resp.status_code in (408, 504):
        return "missed"
    if resp.status_code != 200:
        return "error"
    body, degraded = resp.json(), resp.headers.get("x-degraded")
    choice, tokens = body["choices"][0], body["usage"]["completion_tokens"]
    if elapsed_s * 1000 > req["deadline_ms"]:
        return "missed"
    if degraded is None and body["model"] == "slow" and tokens == req["max_tokens"]:
        return "full"
    if degraded is None:  # cut at its deadline although its estimate fit: its finish reason says so
        ok = (
            body["model"] == "slow" and choice["finish_reason"] == "length" and 0 < tokens < req["max_tokens"]
        )
        return "partial" if ok else "error"
    if degraded == "fallback; model=fast":
        return "fallback" if body["model"] == "fast" and tokens == req["max_tokens"] else "error"
    if degraded == "partial":
        ok = choice["finish_reason"] == "length" and 0 < tokens <= req["max_tokens"]
        return "partial" if ok else "error"
    return "error"


async def _one(client: httpx.AsyncClient, key: str, policy: str, req: dict[str, Any], t0: float) -> str:
    await asyncio.sleep(max(0.0, t0 + req["at"] - time.perf_counter()))
    headers = {"Authorization": f"Bearer {key}", "X-Timeout-Ms": str(req["deadline_ms"]),
               "X-On-Infeasible": policy}  # fmt: skip
    body = {
        "model": "slow",
        "prompt": "d" * req["prompt"],
        "max_tokens": req["max_tokens"],
        "ignore_eos": True,
    }
    sent = time.perf_counter()
    try:
        resp = await client.post("/v1/completions", json=body, headers=headers)
    except httpx.HTTPError:
        return verdict(None, req, 0.0)
    return verdict(resp, req, time.perf_counter() - sent)


async def run_policy(url: str, key: str, policy: str, planned: list[dict[str, Any]]) -> dict[str, int]:
    """Send the plan open loop under one policy; counts of each outcome."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one(client, key, policy, r, t0) for r in planned))
    return {o: results.count(o) for o in OUTCOMES}


def summary(counts: dict[str, int], duration_s: float) -> dict[str, Any]:
    """Goodput (good answers per second) and the share of each outcome."""
    total = sum(counts.values()) or 1
    good = sum(counts[o] for o in GOOD)
    return {
        **counts,
        "offered": total,
        "good": good,
        "goodput_rps": good / duration_s,
        "good_share": good / total,
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> Path:
    """Stacked bars: each policy's outcomes, as shares of the offered requests."""
    import matplotlib.pyplot as plt

    from bench.plots import save  # sets the Agg backend

    colours = {"full": "tab:green", "fallback": "tab:olive", "partial": "tab:cyan", "rejected": "tab:gray",
               "missed": "tab:red", "error": "black"}  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(results)
    bottom = [0.0] * len(names)
    for outcome in OUTCOMES:
        share = [results[p][outcome] / results[p]["offered"] for p in names]
        ax.bar(names, share, bottom=bottom, color=colours[outcome], label=outcome)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    for i, p in enumerate(names):
        ax.text(i, 1.02, f"{results[p]['goodput_rps']:.2f} good/s", ha="center", fontsize=9)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("share of offered requests")
    ax.set_title("Deadlines over a slow and a fast model: outcome by X-On-Infeasible")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    return save(fig, path, dpi=110)


def table(results: dict[str, dict[str, Any]]) -> str:
    """The markdown table of the report."""
    rows = (
        " | ".join([p, str(r["offered"]), *(str(r[o]) for o in OUTCOMES), f"{r['good_share']:.0%}"])
        + f" | {r['goodput_rps']:.2f}"
        for p, r in results.items()
    )
    header = f"policy | offered | {' | '.join(OUTCOMES)} | good share | SLO goodput (req/s)"
    return "\n".join(harness.table(header, "l" * (len(OUTCOMES) + 4), rows))


def start_gateway(models: list[Path], data_dir: Path) -> tuple[str, str, uvicorn.Server, threading.Thread]:
    """`serve --model fast --model slow --fallback-model slow=fast` in-process; its URL and a `bench` key."""
    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    local = {"local_models": [str(m) for m in models], "fallback_models": ["slow=fast"]}
    # Infeasible deadlines are refused on purpose, by the dozen: no refusal budget.
    settings = GatewaySettings.load(
        {"data_dir": data_dir, "port": 0, "refusal_burst": 10**6, "models": local}
    )
    app = create_app(settings, None)
    url, server, thread = serve_on_thread(app, 300.0)
    store = app.state.gateway.store
    key, _ = store.create_key((store.get_tenant("bench") or store.create_tenant("bench")).id, name="bench")
    return url, key, server, thread


def run_deadlines(out: Path, rate: float, duration_s: float, rounds: int, seed: int) -> dict[str, Path]:
    """Build the models, start the gateway over both, run every policy `rounds` times; write the report."""
    out.mkdir(parents=True, exist_ok=True)
    models = [build_model(out / "models", name) for name in ("fast", "slow")]
    url, key, server, thread = start_gateway(models, out / "data")
    auth = {"Authorization": f"Bearer {key}"}
    try:
        planned = plan(rate, duration_s, seed)
        for model in ("fast", "slow", "fast", "slow"):  # both models measured before the first deadline
            body = {"model": model, "prompt": "warm " * 40, "max_tokens": 16}
            httpx.post(f"{url}/v1/completions", json=body, headers=auth, timeout=120).raise_for_status()
        counts = {p: dict.fromkeys(OUTCOMES, 0) for p in POLICIES}
        for r in range(rounds):
            for policy in POLICIES[r % len(POLICIES) :] + POLICIES[: r % len(POLICIES)]:  # rotate the order
                for outcome, n in asyncio.run(run_policy(url, key, policy, planned)).items():
                    counts[policy][outcome] += n
    finally:
        server.should_exit = True  # the gateway drains and stops the engines it started
        thread.join(60)
    results = {p: summary(c, duration_s * rounds) for p, c in counts.items()}
    (out / "deadlines.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "deadlines.md").write_text(table(results) + "\n")
    return {"json": out / "deadlines.json", "markdown": out / "deadlines.md",
            "plot": plot(results, out / "deadlines.png")}  # fmt: skip
