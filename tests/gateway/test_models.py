"""Several models behind one gateway, and deadlines that degrade instead of failing (#32).

Two real `fairserve engine` processes serve two locally built models of different speed (`fast`, `slow`:
tests/gateway/two_models.py); the gateway attaches to both (`--engine A --engine B`), falls `slow` back to
`fast` and charges `slow` four times. Deadlines are set from the rates the gateway shows for each model in
/admin/api/engines (the very rates admission estimates with), halfway (geometrically) between what one
outcome and the other needs, so each test's outcome does not hang on how busy the machine is.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from admission.model_feasibility import TRUNCATE_HEADROOM
from gateway.settings import GatewaySettings
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.gateway.conftest import Server, start_server, wait_for
from tests.gateway.serve_process import ServeProcess
from tests.gateway.two_models import build_model

# Deadlines sized from the rates the engines showed just before: run alone (scripts/test.sh).
pytestmark = pytest.mark.serial

# Charged in new tokens only, as the ledger test compares one prompt's charge on two models by --model-cost:
# the step cost model's work (engine/core/step_cost.py) scales with each model's own attention-to-linear
# ratio, and the gateway's preprocessing CPU past its free 5 ms (gateway/openai/preprocess.py), charged at
# the grammar's rate, is measured CPU time, which differs from one request to the next (a CI run charged
# one of two identical prompts 59 tokens more). A rate of 10^12 µs a token charges no CPU.
ENGINE_ARGS = (
    "--num-kv-blocks",
    "512",
    "--max-num-batched-tokens",
    "256",
    "--max-num-seqs",
    "8",
    "--no-step-cost-charge",
    "--mask-us-per-token",
    "1e12",
)


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway over a fast and a slow engine process, tenants alice and bob."""
    root = tmp_path_factory.mktemp("two-models")
    engines = [
        EngineProcess(root / f"engine-{name}", "--model", str(build_model(root, name)), *ENGINE_ARGS)
        for name in ("fast", "slow")
    ]
    server: Server | None = None
    try:
        settings = GatewaySettings.load(
            {
                "data_dir": root / "gateway",
                "port": 0,
                "refusal_burst": 10_000,
                "engines": [e.address for e in engines],
                "models": {"fallback_models": ["slow=fast"], "model_costs": ["slow=4"]},
            }
        )
        server = start_server(settings, None)
        server.add_tenant("alice")
        server.add_tenant("bob")
        for name in ("fast", "slow"):  # the rates each model is estimated by come from its own work
            for i in range(3):
                assert _post(server, "alice", name, f"warm {i} " * 20, 16).status_code == 200
        yield server
    finally:
        if server is not None:
            server.stop()
        for engine in engines:
            engine.stop()


def _post(
    server: Server, tenant: str, model: str, prompt: str, max_tokens: int, **headers: str
) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    return httpx.post(
        f"{server.url}/v1/completions", json=body, headers=server.headers(tenant, **headers), timeout=60
    )


def _admin(server: Server, method: str, path: str, **kwargs: Any) -> httpx.Response:
    auth = {"Authorization": f"Bearer {server.state.admin_token}"}
    return httpx.request(method, f"{server.url}/admin/api{path}", headers=auth, timeout=30, **kwargs)


def _rates(server: Server) -> dict[str, tuple[float, float]]:
    """(prefill tokens/s, iteration s) per model, as /admin/api/engines shows them."""
    rows = _admin(server, "GET", "/engines").json()["engines"]
    out = {}
    for row in rows:
        f = row["feasibility"]
        out[row["model"]] = (f["prefill_tokens_per_s"], f["iteration_s"])
    return out


def _needs(rate: tuple[float, float], prompt_tokens: float, max_tokens: int) -> float:
    """Seconds an idle engine at `rate` needs for the request, as admission estimates it."""
    return prompt_tokens / rate[0] + max_tokens * rate[1]


def _between(low: float, high: float) -> str:
    """An X-Timeout-Ms halfway (geometrically) between two needs; the test needs them well apart."""
    assert high > 3 * low, f"the outcomes are too close to separate: {low:.3f}s vs {high:.3f}s"
    return str(int(math.sqrt(low * high) * 1000))


def test_models_are_listed_and_routed_by_name_and_an_unknown_one_is_404(two: Server) -> None:
    auth = two.headers("alice")
    listed = httpx.get(f"{two.url}/v1/models", headers=auth, timeout=30).json()
    assert [m["id"] for m in listed["data"]] == ["fast", "slow"]
    for name in ("fast", "slow"):
        resp = _post(two, "alice", name, "hello", 4)
        assert resp.status_code == 200 and resp.json()["model"] == name
        assert "x-degraded" not in resp.headers
    resp = _post(two, "alice", "medium", "hello", 4)
    assert resp.status_code == 404, resp.text
    err = resp.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "'fast'" in err["message"] and "'slow'" in err["message"]
    rows = _admin(two, "GET", "/engines").json()["engines"]
    assert sorted(r["model"] for r in rows) == ["fast", "slow"]
    assert all(r["feasibility"]["source"] == "measured" and r["feasibility"]["samples"] > 0 for r in rows)


def test_fallback_serves_on_the_smaller_model_and_reject_refuses(two: Server) -> None:
    rates = _rates(two)
    prompt, max_tokens = "x" * 200, 48  # 201 tokens
    timeout = _between(_needs(rates["fast"], 201, max_tokens), _needs(rates["slow"], 201, max_tokens))
    refused = _post(two, "alice", "slow", prompt, max_tokens, **{"X-Timeout-Ms": timeout})
    # The idle slow model itself cannot meet it: waiting cannot help, so no Retry-After (docs/gateway.md).
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "deadline_unmeetable"
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"
    served = _post(
        two, "alice", "slow", prompt, max_tokens, **{"X-Timeout-Ms": timeout, "X-On-Infeasible": "fallback"}
    )
    assert served.status_code == 200, served.text
    assert served.json()["model"] == "fast"
    assert served.headers["x-degraded"] == "fallback; model=fast"
    assert served.json()["usage"]["completion_tokens"] == max_tokens
    row = two.usage_rows("request_id = :r", r=served.headers["x-request-id"])[0]
    assert (row["model"], row["served_model"], row["degradation"]) == ("slow", "fast", "fallback")


def test_partial_ends_at_the_deadline_with_the_tokens_so_far(two: Server) -> None:
    rates = _rates(two)
    prompt, max_tokens = "y" * 20, 400  # 21 tokens
    timeout = _between(_needs(rates["slow"], 21, 1), _needs(rates["slow"], 21, max_tokens))
    headers = {"X-Timeout-Ms": timeout, "X-On-Infeasible": "partial"}
    resp = _post(two, "alice", "slow", prompt, max_tokens, **headers)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert resp.headers["x-degraded"] == "partial" and body["model"] == "slow"
    assert body["choices"][0]["finish_reason"] == "length"
    assert 0 < body["usage"]["completion_tokens"] < max_tokens
    row = two.usage_rows("request_id = :r", r=resp.headers["x-request-id"])[0]
    assert (row["status"], row["finish_reason"], row["degradation"]) == ("completed", "length", "partial")


def test_a_partial_stream_says_so_up_front_and_ends_with_a_final_chunk(two: Server) -> None:
    rates = _rates(two)
    timeout = _between(_needs(rates["slow"], 21, 1), _needs(rates["slow"], 21, 400))
    body = {"model": "slow", "prompt": "z" * 20, "max_tokens": 400, "ignore_eos": True, "stream": True}
    headers = two.headers("alice", **{"X-Timeout-Ms": timeout, "X-On-Infeasible": "partial"})
    with httpx.stream("POST", f"{two.url}/v1/completions", json=body, headers=headers, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["x-degraded"] == "partial"
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    import json

    reasons = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1] if json.loads(e)["choices"]]
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])


def _fits(rate: tuple[float, float], prompt_tokens: float, max_tokens: int) -> tuple[str, float]:
    """An X-Timeout-Ms for the prefill of `prompt_tokens` and the decode, and the prompt tokens that deadline
    holds at `rate` once its milliseconds are rounded down (what truncation's budget is a share of)."""
    ms = int(_needs(rate, prompt_tokens, max_tokens) * 1000)
    return str(ms), (ms / 1000 - max_tokens * rate[1]) * rate[0]


def _truncated(resp: httpx.Response, two: Server, prompt_tokens: int, context: str) -> int:
    """The tokens a truncated answer dropped, checked against its header, usage and ledger row."""
    assert resp.status_code == 200, f"{resp.status_code} {resp.text} ({context})"
    kind, _, dropped_text = resp.headers.get("x-degraded", "").partition("; dropped=")
    assert kind == "truncated", f"X-Degraded {resp.headers.get('x-degraded')!r} ({context})"
    dropped = int(dropped_text)
    assert resp.json()["usage"]["prompt_tokens"] == prompt_tokens - dropped
    row = two.usage_rows("request_id = :r", r=resp.headers["x-request-id"])[0]
    assert (row["degradation"], row["dropped_tokens"]) == ("truncated", dropped)
    return dropped


def test_truncate_drops_the_oldest_prompt_tokens_to_fit(two: Server) -> None:
    rates = _rates(two)
    prompt_tokens, max_tokens = 1201, 4
    # A deadline for half the prompt: the whole prompt needs twice that, so it is truncated, and the kept
    # part (TRUNCATE_HEADROOM of what the deadline holds) leaves the product's spare fifth of the prefill.
    timeout, holds = _fits(rates["slow"], prompt_tokens / 2, max_tokens)
    headers = {"X-Timeout-Ms": timeout, "X-On-Infeasible": "truncate"}
    resp = _post(two, "alice", "slow", "w" * (prompt_tokens - 1), max_tokens, **headers)
    context = f"rates {rates}, X-Timeout-Ms {timeout}, holds {holds:.0f} tokens"
    dropped = _truncated(resp, two, prompt_tokens, context)
    # Never more kept than the deadline holds at the rate the gateway showed (the headroom leaves a quarter
    # of slack for the rate it re-learns in between), never nothing.
    assert prompt_tokens - holds < dropped < prompt_tokens, context


def test_a_truncated_chat_keeps_its_system_message_and_latest_turns(two: Server) -> None:
    system = {"role": "system", "content": "Answer in one word. " * 4}
    turns = [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} " * 25} for i in range(5)]
    tokenizer = two.state.engine.tokenizer  # both models speak the byte tokenizer
    lengths = {k: len(tokenizer.encode_chat([system, *turns[k:]])) for k in range(len(turns))}
    rates = _rates(two)
    # Truncation drops whole turns, so a budget between two lengths keeps exactly the shorter: aim it halfway
    # (geometrically) between the system message with the last turn and with the last two. The decision then
    # stands the gateway's rate off by a fifth either way, and what is kept needs about three fifths of the
    # deadline's prefill time (lengths 264 and 442 here), a slowdown of half as much again still on time.
    keep = len(turns) - 1
    budget = math.sqrt(lengths[keep] * lengths[keep - 1])
    timeout, holds = _fits(rates["slow"], budget / TRUNCATE_HEADROOM, 4)
    body = {"model": "slow", "messages": [system, *turns], "max_tokens": 4, "ignore_eos": True}
    headers = two.headers("alice", **{"X-Timeout-Ms": timeout, "X-On-Infeasible": "truncate"})
    resp = httpx.post(f"{two.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    context = f"rates {rates}, lengths {lengths}, X-Timeout-Ms {timeout}, holds {holds:.0f} tokens"
    dropped = _truncated(resp, two, lengths[0], context)
    # The system message and the latest turn kept, the four turns before it dropped whole.
    assert lengths[0] - dropped == lengths[keep], context


def test_nothing_feasible_is_refused_without_retry_whatever_the_policy(two: Server) -> None:
    for policy in ("fallback", "partial", "truncate"):
        # 1 ms cannot hold even the first token of anything, even on an idle engine: no Retry-After.
        resp = _post(two, "alice", "slow", "v" * 50, 8, **{"X-Timeout-Ms": "1", "X-On-Infeasible": policy})
        assert resp.status_code in (400, 408), resp.text
        assert resp.json()["error"]["code"] in ("deadline_unmeetable", "deadline_passed")
        assert "retry-after" not in resp.headers


def test_a_bad_policy_header_is_400_naming_it(two: Server) -> None:
    resp = _post(two, "alice", "slow", "hi", 4, **{"X-On-Infeasible": "pray"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "X-On-Infeasible"


def test_a_tenants_default_policy_reaches_only_its_own_requests(two: Server) -> None:
    bad = _admin(two, "PATCH", "/tenants/bob", json={"on_infeasible": "always"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "on_infeasible"
    set_ = _admin(two, "PATCH", "/tenants/bob", json={"on_infeasible": "fallback"})
    assert set_.status_code == 200 and set_.json()["on_infeasible"] == "fallback"
    rates = _rates(two)
    timeout = _between(_needs(rates["fast"], 201, 48), _needs(rates["slow"], 201, 48))
    bob = _post(two, "bob", "slow", "u" * 200, 48, **{"X-Timeout-Ms": timeout})
    alice = _post(two, "alice", "slow", "u" * 200, 48, **{"X-Timeout-Ms": timeout})
    assert bob.status_code == 200 and bob.headers["x-degraded"] == "fallback; model=fast"
    # The server's default, reject (400: the idle slow model cannot meet it): bob's default is bob's alone.
    assert alice.status_code == 400 and alice.json()["error"]["code"] == "deadline_unmeetable"
    # bob's own header still wins over bob's default.
    strict = _post(
        two, "bob", "slow", "u" * 200, 48, **{"X-Timeout-Ms": timeout, "X-On-Infeasible": "reject"}
    )
    assert strict.status_code == 400


def test_the_ledger_charges_by_model_and_the_usage_api_and_metrics_show_degradations(two: Server) -> None:
    # Identical fresh prompts on each model: the same engine service, charged 1x on fast and 4x on slow.
    ids = {}
    for name in ("fast", "slow"):
        resp = _post(two, "bob", name, "charge me once " * 8, 8, **{"X-Request-Id": f"charge-{name}"})
        assert resp.status_code == 200
        ids[name] = two.usage_rows("request_id = :r", r=f"charge-{name}")[0]
    assert ids["fast"]["charged_service"] > 0
    assert ids["slow"]["charged_service"] == pytest.approx(4 * ids["fast"]["charged_service"])
    usage = _admin(two, "GET", "/usage?window=1h").json()
    served = usage["served"][two.tenants["alice"].id]
    assert served["by_model"]["fast"] > 0 and served["by_model"]["slow"] > 0
    assert {"fallback", "partial", "truncated"} <= set(served["degraded"])
    assert served["dropped_tokens"] > 0
    assert usage["served"][two.tenants["bob"].id]["degraded"].get("partial") is None
    metrics = httpx.get(
        f"{two.url}/metrics", headers={"Authorization": f"Bearer {two.state.admin_token}"}, timeout=30
    ).text
    alice = two.state.metrics.labels.label(two.tenants["alice"].id)
    line = f'fairserve_degradations_total{{kind="partial",tenant="{alice}"}} '
    assert any(row.startswith(line) and float(row.split()[-1]) >= 2 for row in metrics.splitlines()), [
        row for row in metrics.splitlines() if "degradations" in row
    ]


def test_serve_model_twice_starts_one_local_engine_per_model(tmp_path: Path) -> None:
    fast, slow = build_model(tmp_path, "fast"), build_model(tmp_path, "slow")
    serve = ServeProcess(
        tmp_path / "data", "--model", str(fast), "--model", str(slow), "--num-kv-blocks", "256"
    )
    try:
        auth = serve.headers(serve.banner["api_key"])
        listed = httpx.get(f"{serve.url}/v1/models", headers=auth, timeout=30).json()
        assert [m["id"] for m in listed["data"]] == ["fast", "slow"]
        for name in ("fast", "slow"):
            body = {"model": name, "prompt": "hi", "max_tokens": 3}
            resp = httpx.post(f"{serve.url}/v1/completions", json=body, headers=auth, timeout=60)
            assert resp.status_code == 200 and resp.json()["model"] == name
        _kill_one_model_engine(serve, slow)
    finally:
        serve.stop()
    assert serve.proc.returncode == 0


def _kill_one_model_engine(serve: ServeProcess, model_dir: Path) -> None:
    """SIGKILL the worker of `model_dir`'s model with its directory moved away, so that the new worker cannot
    start until it is back: while it is away the model is down, for as long as the test looks. Its requests
    get 503 `engine_unavailable` with Retry-After, the other model serves and the gateway stays ready;
    once the directory is back the model's own watcher replaces its worker and it serves again."""
    model, away = model_dir.name, model_dir.with_name(model_dir.name + ".away")
    auth = serve.headers(serve.banner["api_key"])
    admin = {"Authorization": f"Bearer {serve.banner['admin_token']}"}
    with httpx.Client(base_url=serve.url, timeout=60) as client:

        def post(name: str) -> httpx.Response:
            body = {"model": name, "prompt": "still there?", "max_tokens": 3}
            return client.post("/v1/completions", json=body, headers=auth)

        def pids() -> dict[str, int]:
            rows = client.get("/admin/api/engines", headers=admin).json()["engines"]
            return {row["model"]: row["pid"] for row in rows}

        def up() -> dict[str, bool]:
            return {e["model"]: e["up"] for e in client.get("/readyz").json()["engines"]}

        before = pids()
        other = next(name for name in before if name != model)
        model_dir.rename(away)
        os.kill(before[model], signal.SIGKILL)
        wait_for(lambda: not up()[model], 60, f"{model}'s engine marked down")
        for _ in range(3):
            refused = post(model)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "engine_unavailable"
            assert int(refused.headers["retry-after"]) >= 1
            served = post(other)
            assert served.status_code == 200 and served.json()["model"] == other
            ready = client.get("/readyz")
            assert ready.status_code == 200 and up() == {other: True, model: False}
        away.rename(model_dir)
        wait_for(lambda: up()[model], 120, f"{model}'s replacement worker")
        after = pids()
        assert after[model] != before[model] and after[other] == before[other]
        assert post(model).status_code == 200
