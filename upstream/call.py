"""One call to an upstream engine: the request body it gets, and its SSE stream read as chunks.

Every call streams (`stream: true`), whether or not the client asked for a stream: the dispatcher charges
each output token as it arrives, and the gateway re-buffers for a client that wanted one JSON body. The
call goes to `/v1/completions` with the prompt the gateway already rendered (chat template included), so
the engine computes exactly the tokens the gateway checked and counts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from engine.core.errors import InvalidRequestError
from engine.core.sampling_params import SamplingParams
from upstream.kinds import KindTraits


class RetryableFailure(Exception):
    """The replica refused the connection or answered 5xx, or the stream broke: another replica may serve."""


@dataclass(frozen=True)
class Usage:
    """The engine's own count of a request's tokens (cumulative so far, or final)."""

    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Chunk:
    """One SSE event of a completion stream."""

    text: str
    finish_reason: str | None
    usage: Usage | None


def request_body(model: str, prompt: str, params: SamplingParams, traits: KindTraits) -> dict[str, Any]:
    """The JSON of the call. Engines that take sampling extensions (vLLM, SGLang) get them; a plain
    OpenAI-compatible server gets only the standard fields."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": traits.stream_options(),
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    if traits.continuous_usage:  # vLLM and SGLang
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.ignore_eos:
            body["ignore_eos"] = True
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
    return body


def refuse_unsupported(params: SamplingParams) -> None:
    """InvalidRequestError naming the field an upstream model does not serve through fairserve."""
    if params.n != 1:
        raise InvalidRequestError("n: an upstream model serves one choice per request", "n")
    if params.logprobs is not None:
        raise InvalidRequestError("logprobs: not served for an upstream model", "logprobs")
    if params.grammar is not None:
        raise InvalidRequestError(
            f"{params.grammar.field}: constrained decoding is not served for an upstream model",
            params.grammar.field,
        )


async def open_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], request_id: str
) -> httpx.Response:
    """POST `body` to the replica at `url`; the response once its headers are in (its body not read).

    `X-Request-Id` is the gateway's own id of the engine request (never the client's), which vLLM and
    SGLang take as theirs: the engine's logs and the ledger name the request alike.

    RetryableFailure for a refused connection or a 5xx; InvalidRequestError for a 4xx (the engine refused
    this request: the client's to fix, not the replica's fault).
    """
    headers = {"X-Request-Id": request_id}
    request = client.build_request("POST", f"{url}/v1/completions", json=body, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise RetryableFailure(f"{url}: {type(exc).__name__}") from exc
    if response.status_code < 400:
        return response
    try:
        detail = (await response.aread()).decode(errors="replace")[:300]
    except httpx.TransportError:
        detail = ""
    finally:
        await response.aclose()
    if response.status_code >= 500:
        raise RetryableFailure(f"{url} answered {response.status_code}")
    raise InvalidRequestError(f"the upstream engine refused the request: {detail}", None)


async def read_chunks(response: httpx.Response) -> AsyncIterator[Chunk]:
    """The chunks of an open stream until `[DONE]` or its end; RetryableFailure when it breaks. Closing the
    generator closes the connection, which is how vLLM, SGLang and TGI learn to abort the request."""
    try:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            chunk = parse_chunk(data)
            if chunk is not None:
                yield chunk
    except httpx.TransportError as exc:  # reset, read timeout, a stream cut short
        raise RetryableFailure(f"the stream broke: {type(exc).__name__}") from exc
    finally:
        await response.aclose()


def parse_chunk(data: str) -> Chunk | None:
    """One `data:` payload as a Chunk; None for one that is not a completion chunk (an engine's keep-alive)."""
    try:
        event = json.loads(data)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    if "error" in event:
        raise RetryableFailure(f"the engine reported an error mid-stream: {str(event['error'])[:200]}")
    text, reason = "", None
    choices = event.get("choices") or []
    if choices and isinstance(choices[0], dict):
        text = str(choices[0].get("text") or "")
        reason = choices[0].get("finish_reason")
    usage = event.get("usage")
    parsed = None
    if isinstance(usage, dict):
        parsed = Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
    return Chunk(text, str(reason) if reason else None, parsed)
