"""Prefill and decode on separate engines (DistServe): the engine loop's side of a KV hand-off.

A request runs in two parts, on two engines, under one request id:

- **prefill** (`meta.kv_handoff == HOLD`): the request runs as on any engine until its first token is
  sampled. Then, before anything else is scheduled, `HandoffLoop` takes its block table out of the pool
  (the blocks stay referenced: nobody else gets them), ends it with finish_reason `handoff`, and offers
  the blocks to the KV server (engine/serving/remote/kv_transfer.py) until a decode engine pulls them or
  `kv_hold_timeout_s` passes; either way the loop frees them then. Prefix-cache hits count as on any
  engine: the matched blocks are part of the held table, and go back to the cache when it is freed.
- **decode** (`meta.kv_handoff` is the prefill engine's KV address): the Submit carries the prompt plus
  the first token and `max_tokens` less one. The loop asks the puller for the KV; while it travels the
  scheduler holds the request in state `WAITING_FOR_KV` (engine/core/waits.py: an abort or its deadline
  ends it there, `cancel_state` "transfer"). When the blocks arrive it goes on through the scheduler's
  waits (adapter, grammar) and is queued as a *swapped-out* request whose KV covers everything but the
  first token: admission swaps it in, in fair-share order, when seats and blocks allow (the same path
  as swap preemption), and the next step computes the first token and samples the second.

Text (requests with stop strings, detokenized in the loop): the prefill part does not release what it
holds back at the hand-off, neither a possible start of a stop string nor an incomplete character. The
first goes out as `OutputDelta.held_text` and comes back in the decode part's `RequestMeta.held_text`,
where its StopMatcher starts with it held; the decode part's detokenizer pushes the first token (its last
prompt id) unreleased. Text, stop and the token it ends at are then what one engine would have.

Charging: each token is charged once. The prefill engine charges the prompt (and the first token, which
it samples); the decode engine marks the whole prompt it was given as charged and charges only the
tokens it samples. With counters shared through Redis (engine/serving/counter_sync.py) both parts count
towards one fair share.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.core.kv_cache import BlockTable
from engine.core.outputs import OutputDelta, RequestMetrics
from engine.core.request import KV_HOLD, FinishReason, RequestState
from engine.serving.boundary.messages import IterationReport, Submit, SubmitFailed
from engine.serving.boundary.worker import EngineLoop, Inbox
from engine.serving.llm_engine import LLMEngine

log = logging.getLogger("fairserve.engine.disagg")

HOLD = KV_HOLD  # RequestMeta.kv_handoff on a prefill engine (engine/core/request.py)
KVBlocks = list[
    tuple[torch.Tensor, torch.Tensor]
]  # per block-pool layer: K and V, [blocks, block, heads, dim]


class KVShipper(Protocol):
    """A prefill engine's KV server: serves held blocks to the decode engine that pulls them."""

    def offer(self, request_id: str, block_ids: list[int], num_tokens: int) -> None:
        """Hold these blocks (the first `num_tokens` positions) for a pull; thread-safe."""


class KVFetcher(Protocol):
    """A decode engine's puller: fetches a request's KV from a prefill engine's KV server."""

    transfers: int  # pulls answered with KV so far, their seconds and bytes
    transfer_s: float
    transfer_bytes: int

    def fetch(self, source: str, request_id: str) -> None:
        """Start pulling; the answer comes back on the loop's inbox as a KVArrived."""


@dataclass
class ReleaseHeld:
    """Put on a prefill engine's inbox: the blocks held for this request were pulled or expired."""

    request_id: str


@dataclass
class KVArrived:
    """Put on a decode engine's inbox: a request's KV (`blocks`, `num_tokens` positions) or why not."""

    request_id: str
    blocks: KVBlocks | None
    num_tokens: int = 0
    error: str = ""


def reblock(blocks: KVBlocks, num_tokens: int, block_size: int) -> KVBlocks:
    """The same KV cut into this engine's block size (prefill and decode engines may differ)."""
    need = -(-num_tokens // block_size)

    def one(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1, *t.shape[2:])[:num_tokens]
        pad = need * block_size - num_tokens
        if pad:
            flat = torch.cat([flat, flat.new_zeros(pad, *flat.shape[1:])])
        return flat.reshape(need, block_size, *flat.shape[1:])

    return [(one(k), one(v)) for k, v in blocks]


class HandoffLoop(EngineLoop):
    """The engine loop of a `--role prefill` or `--role decode` engine (see the module docstring)."""

    def __init__(
        self,
        engine: LLMEngine,
        inbox: Inbox,
        publish: Any,
        shipper: KVShipper | None = None,
        fetcher: KVFetcher | None = None,
    ) -> None:
        super().__init__(engine, inbox, publish)
        self.shipper = shipper
        self.fetcher = fetcher
        self._holding: set[str] = set()  # prefill: to hand off once their first token is out
        self._held: dict[str, BlockTable] = {}  # prefill: tables kept until pulled or expired

    @property
    def held(self) -> int:
        """Requests whose blocks this prefill engine holds for a pull."""
        return len(self._held)

    # -- messages -----------------------------------------------------------------------------
    def _apply(self, msg: Any) -> None:
        if isinstance(msg, Submit) and msg.meta.kv_handoff:
            self._take_handoff(msg)
        elif isinstance(msg, ReleaseHeld):
            self._release(msg.request_id)
        elif isinstance(msg, KVArrived):
            self._adopt(msg)
        else:
            super()._apply(msg)

    def _refuse(self, submit: Submit, message: str, kind: str = "EngineDeadError") -> None:
        self.publish(SubmitFailed(submit.request_id, kind, message, None))

    def _take_handoff(self, submit: Submit) -> None:
        rid = submit.request_id
        if submit.meta.kv_handoff == HOLD:
            if self.shipper is None:
                self._refuse(submit, "this engine is not a prefill engine (--role prefill)")
                return
            super()._apply(submit)
            if rid in self.engine.scheduler.requests:
                self._holding.add(rid)
            return
        if self.fetcher is None:
            self._refuse(submit, "this engine is not a decode engine (--role decode)")
            return
        live = rid in self.engine.scheduler.requests
        super()._apply(submit)  # held in the scheduler for its KV (weights applied), or refused
        if not live and rid in self.engine.scheduler.requests:
            self.fetcher.fetch(str(submit.meta.kv_handoff), rid)

    # -- prefill: hand off after the first token ------------------------------------------------
    def _report(self, outputs: list[OutputDelta]) -> None:
        if self._holding:
            outputs = [self._hand_off(d) if d.request_id in self._holding else d for d in outputs]
        self._published_at = time.monotonic()
        stats = self.engine.stats()
        if self.fetcher is not None:
            stats.kv_transfers, stats.kv_transfer_s = self.fetcher.transfers, self.fetcher.transfer_s
            stats.kv_transfer_bytes = self.fetcher.transfer_bytes
        self.publish(IterationReport(outputs, stats, self._new_traces()))

    def _hand_off(self, delta: OutputDelta) -> OutputDelta:
        """End the request here with its first token, keeping its blocks for the decode engine."""
        rid = delta.request_id
        engine = self.engine
        request = engine.scheduler.requests.get(rid)
        if delta.finished or request is None or not request.output_token_ids:
            self._holding.discard(rid)  # it ended here (a stop, max_tokens, an abort): nothing to ship
            return delta
        self._holding.discard(rid)
        table = engine.pool.tables.pop(rid)  # its blocks stay referenced: finish() frees nothing now
        computed = request.num_computed_tokens
        engine.scheduler.finish(request, FinishReason.HANDOFF)
        emitted = engine.collect_outputs([request])  # closes its stream
        tail = "".join(text for _, _, _, text, _ in emitted)
        held = "".join(stream.stop.held for _, stream, *_ in emitted)  # travels to the decode part
        self._held[rid] = table
        assert self.shipper is not None
        self.shipper.offer(rid, list(table.block_ids), computed)
        return OutputDelta(
            rid,
            delta.new_token_ids,
            delta.delta_text + tail,
            True,
            FinishReason.HANDOFF,
            RequestMetrics.of(request),
            held,
            delta.logprobs,
        )

    def _release(self, request_id: str) -> None:
        table = self._held.pop(request_id, None)
        if table is not None:
            key = f"\0held:{request_id}"  # back under a name no request has, then freed as any table
            self.engine.pool.tables[key] = table
            self.engine.pool.free(key)
            self._report([])  # the gateways see the blocks back (an idle loop publishes nothing else)

    # -- decode: adopt what arrived -----------------------------------------------------------
    def _adopt(self, arrived: KVArrived) -> None:
        rid = arrived.request_id
        engine = self.engine
        request = engine.scheduler.requests.get(rid)
        if request is None or request.state is not RequestState.WAITING_FOR_KV:
            return  # cancelled or expired while in transfer
        blocks = arrived.blocks
        error = arrived.error or self._misfit(blocks, arrived.num_tokens, request.num_prompt_tokens)
        if blocks is None or error:
            engine.drop_held(rid)
            self.publish(SubmitFailed(rid, "EngineDeadError", f"KV transfer failed: {error}", None))
            return
        computed = min(arrived.num_tokens, request.num_prompt_tokens - 1)
        request.num_computed_tokens = computed  # so it is queued as a swapped-out request
        request.num_charged_prompt_tokens = request.num_prompt_tokens  # charged on the prefill engine
        request.first_scheduled_time = time.time()
        engine.runner.stage_blocks(rid, reblock(blocks, computed, engine.pool.block_size))
        engine.scheduler.queue_held(request)

    def _misfit(self, blocks: KVBlocks | None, num_tokens: int, prompt_tokens: int) -> str:
        """Why blocks from another engine do not fit this one ('' when they do)."""
        if blocks is None:
            return "no KV came"
        caches = [self.engine.runner.kv_caches[i][0] for i in self.engine.runner.main_layers]
        if len(blocks) != len(caches) or any(
            k.dtype != c.dtype or k.shape[2:] != c.shape[2:]
            for (k, _), c in zip(blocks, caches, strict=False)
        ):
            return "the prefill engine's KV has another shape (another model?)"
        if not 0 < num_tokens < prompt_tokens or num_tokens > blocks[0][0].shape[0] * blocks[0][0].shape[1]:
            return f"{num_tokens} KV positions do not fit a {prompt_tokens}-token prompt"
        return ""

    def _cancel_everything(self) -> None:
        for request_id in list(self._held):
            self._release(request_id)
        super()._cancel_everything()
