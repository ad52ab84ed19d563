"""DisaggRouter: prefill engines and decode engines behind one EngineClient (DistServe).

A request goes to a prefill engine (the pool's own EngineRouter picks it: prefix affinity against load,
so prefix-cache hits count as they do co-located), marked to hand off (engine/serving/disagg.py). Its first
token comes back from there, with finish_reason `handoff`; the router then submits the prompt plus that
token, `max_tokens` less one, to a decode engine (its pool's router picks one), naming the prefill
engine's KV address and carrying the text its stop strings held back (`held_text`), and the decode
engine pulls the KV and continues the stream. The consumer sees one
stream under one request id: the router re-makes the text over the whole output (the parts' fronts each
see only their own; a request with stop strings gets its engines' texts joined), and the last output's metrics add up both parts (prompt and cached tokens from the
prefill engine, completion tokens, charged service, preemptions from both).

It is an EngineRouter over every engine (stats, traces, loads, heartbeats, produced-token records and task
cancels reach all of them), with `submit`, `abort`, `live_request` and weights going through the pools.
A request with `max_tokens == 1` never leaves its prefill engine. Failures: either part's
EngineDeadError (its engine died, or the KV never came) ends the stream with it: the gateway's retryable
503 or error event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import cast

from engine.core.detokenizer import Detokenizer
from engine.core.errors import DuplicateRequestError
from engine.core.outputs import RequestInfo, RequestMetrics, RequestOutput, TokenPrefix, text_in_loop
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.serving.boundary.client import EngineClient
from engine.serving.boundary.front import EngineFront, OutputStream, Sink
from engine.serving.disagg import HOLD
from routing.config import RoutingSettings
from routing.loads import EngineLoad
from routing.router import EngineRouter


class _Run:
    """One request across its two parts: where it is, and the totals the consumer sees."""

    __slots__ = (
        "request_id",
        "prompt",
        "params",
        "meta",
        "outer",
        "phase",
        "source",
        "tokens",
        "text",
        "detokenizer",
        "prefill_metrics",
    )

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        meta: RequestMeta,
        outer: OutputStream,
        detokenizer: Detokenizer | None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.meta = meta
        self.outer = outer
        self.phase = "prefill"
        self.source: EngineClient | None = None  # the prefill engine
        self.tokens: list[int] = []
        self.text = ""
        self.detokenizer = detokenizer  # None: the engine makes the text (stop strings)
        self.prefill_metrics: RequestMetrics | None = None

    def emit(self, item: RequestOutput, final: bool) -> None:
        """Hand the consumer this part's new tokens as one output of the whole request."""
        new_ids = list(item.new_token_ids)
        if not new_ids and not final:
            return
        self.tokens += new_ids
        if self.detokenizer is not None:
            text = self.detokenizer.push(new_ids) if new_ids else ""
            if final:
                text += self.detokenizer.finish()
        else:
            text = item.delta_text
        self.text += text
        metrics = merge_metrics(self.prefill_metrics, item.metrics)
        reason = item.finish_reason if final else None
        tokens = TokenPrefix(self.tokens, len(self.tokens))
        out = RequestOutput(
            self.request_id, self.prompt, new_ids, tokens, text, self.text, final, reason, metrics
        )
        self.outer.put(out)


def merge_metrics(prefill: RequestMetrics | None, decode: RequestMetrics) -> RequestMetrics:
    """One request's metrics from its two parts (only the decode part's when it never left prefill)."""
    if prefill is None:
        return decode
    return RequestMetrics(
        prefill.prompt_tokens,
        prefill.cached_tokens,
        prefill.completion_tokens + decode.completion_tokens,
        prefill.charged_service + decode.charged_service,
        prefill.preemptions + decode.preemptions,
        prefill.recomputed_tokens + decode.recomputed_tokens,
        prefill.tokens_after_cancel + decode.tokens_after_cancel,
        decode.cancel_state,
        prefill.arrival_time,
        prefill.first_scheduled_time,
        prefill.first_token_time,
        decode.finished_time,
    )


class DisaggRouter(EngineRouter):
    """An EngineClient over a prefill pool and a decode pool of engines serving one model."""

    def __init__(
        self,
        prefill: Mapping[str, EngineClient],
        decode: Mapping[str, EngineClient],
        settings: RoutingSettings | None = None,
    ) -> None:
        if not prefill or not decode:
            raise ValueError("prefill and decode on separate engines needs at least one engine of each role")
        super().__init__({**prefill, **decode}, settings)
        self._prefill = EngineRouter(prefill, self.settings)
        self._decode = EngineRouter(decode, self.settings)
        self._sources = dict(prefill)
        self._runs: dict[str, _Run] = {}

    @property
    def is_alive(self) -> bool:
        """True while an engine of each role is alive."""
        return self._prefill.is_alive and self._decode.is_alive

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        meta: RequestMeta,
        request_id: str,
        sink: Sink | None = None,
    ) -> OutputStream:
        """Send the request to a prefill engine; its decode engine is chosen when its first token is out."""
        with self._lock:
            if request_id in self._runs:
                raise DuplicateRequestError(f"request id {request_id!r} is already live", "request_id")
        prompt = list(prompt_token_ids)
        detokenizer = None if text_in_loop(params) else self.tokenizer.detokenizer(prompt)
        # The consumer's stream: closing it calls this router's `abort` and `_forget`, all it needs of a front.
        outer = OutputStream(cast(EngineFront, self), request_id, sink)
        run = _Run(request_id, prompt, params, meta, outer, detokenizer)
        first = replace(meta, kv_handoff=HOLD) if params.max_tokens > 1 else meta
        self._prefill.submit(prompt, params, first, request_id, partial(self._from_prefill, run))
        run.source = self._sources.get(self._prefill.engine_of(request_id) or "")
        with self._lock:
            self._runs[request_id] = run
        return run.outer

    def _from_prefill(self, run: _Run, item: RequestOutput | BaseException) -> None:
        if self._runs.get(run.request_id) is not run:
            return  # the consumer is gone
        if isinstance(item, BaseException):
            run.outer.put(item)
        elif item.finish_reason is FinishReason.HANDOFF:
            run.prefill_metrics = item.metrics
            run.emit(item, final=False)
            self._to_decode(run, list(item.token_ids), item.held_text)
        else:
            run.emit(item, final=item.finished)

    def _to_decode(self, run: _Run, tokens: list[int], held_text: str) -> None:
        """The prefill part is done: the decode part pulls the KV from where it is held, and its stop strings
        start from the text the prefill part held back (a stop may span the first and second tokens)."""
        params = replace(run.params, max_tokens=run.params.max_tokens - len(tokens))
        address = getattr(run.source, "kv_address", "") or None
        meta = replace(run.meta, kv_handoff=address, held_text=held_text)
        run.phase = "decode"
        try:
            self._decode.submit(
                run.prompt + tokens, params, meta, run.request_id, partial(self._from_decode, run)
            )
        except Exception as exc:  # no decode engine takes it: the stream ends with that error
            run.outer.put(exc)

    def _from_decode(self, run: _Run, item: RequestOutput | BaseException) -> None:
        if self._runs.get(run.request_id) is not run:
            return
        if isinstance(item, BaseException):
            run.outer.put(item)
        else:
            run.emit(item, final=item.finished)

    def _forget(self, request_id: str) -> None:
        """The consumer's stream ended (OutputStream calls its front's `_forget`)."""
        with self._lock:
            self._runs.pop(request_id, None)

    def _pool(self, request_id: str) -> EngineRouter | None:
        with self._lock:
            run = self._runs.get(request_id)
        if run is None:
            return None
        return self._prefill if run.phase == "prefill" else self._decode

    def abort(self, request_id: str, reason: str = "cancelled") -> bool:
        """Cancel a live request where it is now: prefill, in transfer or decoding."""
        pool = self._pool(request_id)
        return pool.abort(request_id, reason) if pool is not None else False

    def live_request(self, request_id: str) -> RequestInfo | None:
        """Owner of a live request, asked of the engine holding it now."""
        pool = self._pool(request_id)
        return pool.live_request(request_id) if pool is not None else None

    def engine_of(self, request_id: str) -> str | None:
        """The key of the engine holding a live request now."""
        pool = self._pool(request_id)
        return pool.engine_of(request_id) if pool is not None else None

    def set_tenant_weight(self, tenant_id: str, weight: float, priority: int | None = None) -> None:
        """Change a tenant's weight on every engine of both pools (and on any that returns)."""
        self._prefill.set_tenant_weight(tenant_id, weight, priority)
        self._decode.set_tenant_weight(tenant_id, weight, priority)

    def engine_loads(self) -> list[EngineLoad]:
        """Each engine's health, load and routed requests (prefill pool first)."""
        return self._prefill.engine_loads() + self._decode.engine_loads()


def role_router(
    engines: Mapping[str, EngineClient], roles: Mapping[str, str], settings: RoutingSettings
) -> EngineRouter:
    """The router for engines that announced these roles: a DisaggRouter once any is prefill or decode."""
    if all(role == "both" for role in roles.values()):
        return EngineRouter(engines, settings)
    if any(role == "both" for role in roles.values()):
        raise ValueError("engines of --role both cannot be mixed with prefill and decode engines")
    prefill = {k: c for k, c in engines.items() if roles[k] == "prefill"}
    decode = {k: c for k, c in engines.items() if roles[k] == "decode"}
    return DisaggRouter(prefill, decode, settings)
