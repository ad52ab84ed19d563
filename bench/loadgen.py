"""Open-loop HTTP load generator: sends a plan at its arrival times, whatever the responses do.

Requests stream (SSE), so TTFT and TPOT are measured at the client. Agent tasks go through
fairserve_client, as an agent would: their attempts run in parallel inside one `client.task()`, the first
that finishes is kept and `task.cancel()` ends the rest. The closed loop is only a labelled comparison:
it offers less load as the server slows and so hides queue growth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2  # openai's own HTTP client, which the agent clients run on
import openai

from bench.workloads import PlannedRequest, Workload
from fairserve_client import AsyncFairServe, AsyncTask

LIMITS = {"max_connections": 1000, "max_keepalive_connections": 200}


@dataclass
class Target:
    """Where to send: base URL, model name, and an API key per tenant name (or one for all)."""

    url: str
    model: str
    keys: dict[str, str]
    default_key: str = ""
    metrics_token: str = ""  # for scraping /metrics (the gateway's metrics or admin token)
    # vLLM and fairserve take `ignore_eos`; `transformers serve` refuses the unknown field (422).
    ignore_eos: bool = True

    def metrics_headers(self) -> dict[str, str]:
        """Authorization for /metrics, when a token is known."""
        return {"Authorization": f"Bearer {self.metrics_token}"} if self.metrics_token else {}

    def key(self, tenant: str) -> str:
        """The tenant's key, else the shared one."""
        return self.keys.get(tenant, self.default_key)


@dataclass
class Outcome:
    """What the client saw of one HTTP request (times are seconds since the run's start)."""

    request_id: str
    tenant: str
    sent_at: float
    status: int = 0
    error_code: str | None = None
    first_token_at: float | None = None
    end_at: float | None = None  # the stream's last byte
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    task_id: str | None = None
    attempt: int = 0
    cancel_sent_at: float | None = None  # the task cancel this attempt was subject to
    kept: bool = False  # the attempt an agent task kept
    # What the client counted itself: chunks that carried text, and the text's UTF-8 bytes (the tokens of
    # the embedded byte tokenizer). Chunks are not tokens: transformers serve sends several in one chunk.
    text_chunks: int = 0
    text_bytes: int = 0

    @property
    def accepted(self) -> bool:
        """The server took the request (200 and a stream)."""
        return self.status == 200

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    @property
    def e2e(self) -> float | None:
        return None if self.end_at is None else self.end_at - self.sent_at

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first."""
        if self.first_token_at is None or self.end_at is None or self.completion_tokens < 2:
            return None
        return (self.end_at - self.first_token_at) / (self.completion_tokens - 1)

    def saw(self, t0: float, text: str | None, finish: str | None, usage: tuple[int, ...] | None) -> None:
        """Record one streamed chunk: its text (the first one times TTFT), finish reason and usage."""
        if text:
            self.text_chunks += 1
            self.text_bytes += len(text.encode())
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter() - t0
        self.finish_reason = finish or self.finish_reason
        if usage is not None:
            self.prompt_tokens, self.completion_tokens, self.cached_tokens = usage


@dataclass
class LoadResult:
    """Every outcome of one run, and how long sending and draining took."""

    outcomes: list[Outcome] = field(default_factory=list)
    started: float = 0.0  # epoch seconds of offset 0
    send_s: float = 0.0  # last arrival offset actually reached
    wall_s: float = 0.0  # until the last response ended


def _params(target: Target, workload: Workload, req: PlannedRequest, attempt: int) -> dict[str, Any]:
    return {
        "model": target.model,
        "prompt": req.prompt,
        "max_tokens": req.max_tokens[attempt],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": workload.temperature,
        "seed": req.seeds[attempt] if req.seeds else None,
    }


def _start(req: PlannedRequest, t0: float, task_id: str | None = None, attempt: int = 0) -> Outcome:
    request_id = f"bench-{uuid.uuid4().hex[:16]}"
    return Outcome(request_id, req.tenant, time.perf_counter() - t0, task_id=task_id, attempt=attempt)


async def stream_one(
    client: httpx.AsyncClient, target: Target, workload: Workload, req: PlannedRequest, t0: float
) -> Outcome:
    """Send one streaming completion and time it; errors become an Outcome, never an exception."""
    out = _start(req, t0)
    body = _params(target, workload, req, 0) | ({"ignore_eos": True} if target.ignore_eos else {})
    headers = {"Authorization": f"Bearer {target.key(req.tenant)}", "X-Request-Id": out.request_id}
    if workload.slo.deadline_s is not None:
        headers["X-Timeout-Ms"] = str(int(workload.slo.deadline_s * 1000))
    try:
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                try:
                    out.error_code = str(json.loads(await resp.aread())["error"]["code"])
                except (ValueError, KeyError, TypeError):
                    out.error_code = f"http_{resp.status_code}"
            else:
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        _event(out, t0, json.loads(line[6:]))
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out.error_code = f"client_{type(exc).__name__}"
    out.end_at = time.perf_counter() - t0
    return out


def _event(out: Outcome, t0: float, event: dict[str, Any]) -> None:
    if "error" in event:
        out.error_code = str(event["error"].get("code") or "stream_error")
        return
    choice, usage = (event.get("choices") or [{}])[0], event.get("usage")
    counts = None
    if usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        counts = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), int(cached))
    out.saw(t0, choice.get("text"), choice.get("finish_reason"), counts)


async def _attempt(
    task: AsyncTask, target: Target, workload: Workload, req: PlannedRequest, attempt: int, t0: float
) -> Outcome:
    """One streamed attempt of an agent task through the client; errors become an Outcome, never an exception."""
    out = _start(req, t0, task.id, attempt)
    client = task.client
    if workload.slo.deadline_s is not None:
        client = client.with_options(deadline_in=workload.slo.deadline_s)
    try:
        stream = await client.completions.create(
            **_params(target, workload, req, attempt),
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": out.request_id, "X-Attempt": str(attempt)},
        )
        out.status = stream.response.status_code
        async for chunk in stream:
            choice, usage, counts = (chunk.choices[0] if chunk.choices else None), chunk.usage, None
            if usage is not None:
                cached = (usage.prompt_tokens_details and usage.prompt_tokens_details.cached_tokens) or 0
                counts = (usage.prompt_tokens, usage.completion_tokens, cached)
            out.saw(t0, choice and choice.text, choice and choice.finish_reason, counts)
    except openai.APIStatusError as exc:
        out.status = exc.status_code
        body = exc.body if isinstance(exc.body, dict) else {}
        out.error_code = str(body.get("code") or f"http_{exc.status_code}")
    except (openai.APIError, httpx2.HTTPError) as exc:  # a broken stream, a lost connection
        out.error_code = f"client_{type(exc).__name__}"
    out.end_at = time.perf_counter() - t0
    return out


async def run_task(
    client: AsyncFairServe, target: Target, workload: Workload, req: PlannedRequest, t0: float
) -> list[Outcome]:
    """An agent task: all attempts at once in one `client.task()`, keep the first finished, cancel the rest."""
    outcomes: list[Outcome] = []
    winner: Outcome | None = None
    cancel_at: float | None = None
    async with client.task(req.task_id) as task:
        pending = {
            asyncio.create_task(_attempt(task, target, workload, req, i, t0)) for i in range(workload.fanout)
        }
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                outcomes.append(o := finished.result())
                if winner is None and o.accepted and o.finish_reason in ("length", "stop"):
                    winner, o.kept = o, True
            if winner is not None and cancel_at is None and pending:
                cancel_at = time.perf_counter() - t0
                # On failure the attempts still end on their own; the report shows them as not cancelled.
                with contextlib.suppress(openai.APIError, httpx2.HTTPError):
                    await task.cancel()
    for o in outcomes:
        if not o.kept and cancel_at is not None and (o.end_at is None or o.end_at >= cancel_at):
            o.cancel_sent_at = cancel_at
    return outcomes


async def run_load(
    target: Target,
    workload: Workload,
    planned: list[PlannedRequest],
    on_done: Callable[[], object] | None = None,
    clients: int = 0,
    duration_s: float = 0.0,
    timeout_s: float = 120.0,
) -> LoadResult:
    """Open loop (`clients` 0): send every planned arrival at its offset, independent of responses.

    COMPARISON ONLY with `clients` > 0: that many workers each send the next planned request when their
    last one ended, for `duration_s`. Either way, wait for every request to end.
    """
    result = LoadResult(started=time.time())
    agents: dict[str, AsyncFairServe] = {}  # one per tenant key; no retries: every attempt measured as sent

    def agent(tenant: str) -> AsyncFairServe:
        if tenant not in agents:
            http = openai.DefaultAsyncHttpxClient(limits=httpx2.Limits(**LIMITS))
            url, key = target.url + "/v1", target.key(tenant)
            agents[tenant] = AsyncFairServe(
                base_url=url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http
            )
        return agents[tenant]

    limits = httpx.Limits(**LIMITS)
    async with httpx.AsyncClient(base_url=target.url, timeout=timeout_s, limits=limits) as http:
        t0 = time.perf_counter()

        async def one(req: PlannedRequest) -> list[Outcome]:
            try:
                if req.task_id is not None:
                    return await run_task(agent(req.tenant), target, workload, req, t0)
                return [await stream_one(http, target, workload, req, t0)]
            finally:
                if on_done is not None:
                    on_done()

        if clients:
            queue = list(reversed(planned))

            async def worker() -> None:
                while queue and time.perf_counter() - t0 < duration_s:
                    result.outcomes.extend(await one(queue.pop()))

            await asyncio.gather(*(worker() for _ in range(clients)))
            result.send_s = min(duration_s, time.perf_counter() - t0)
        else:
            tasks: list[asyncio.Task[list[Outcome]]] = []
            for req in planned:
                if (delay := t0 + req.at - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(req)))
            result.send_s = time.perf_counter() - t0
            for batch in await asyncio.gather(*tasks):
                result.outcomes.extend(batch)
        result.wall_s = time.perf_counter() - t0
    for client in agents.values():
        await client.close()
    return result
