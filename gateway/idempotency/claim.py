"""The request's Idempotency-Key claim as an async context manager: the one place a claim is let go.

Entering claims the key (or learns that the request is a replay or a retry to attach). A refusal raised
inside the block abandons a fresh claim on the way out; once the request's Run is started the claim is
handed over to it, and `settle` at the run's end finishes the record with the response or abandons it.
Every write the pipeline makes to the idempotency store goes through this class.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

from starlette.types import ASGIApp

from admission.breaker import BackendUnavailable
from gateway.edge.errors import APIError
from gateway.openai.context import RequestContext
from gateway.openai.refusals import refused
from gateway.openai.responses import FollowResponse, RunResponse, StoredResponseSender
from gateway.openai.runs import Outcome, Run, publish_chunks
from gateway.state import GatewayState

log = logging.getLogger(__name__)


class KeyClaim:
    """`async with KeyClaim(state, ctx) as claim:`; a request without Idempotency-Key claims nothing."""

    def __init__(self, state: GatewayState, ctx: RequestContext) -> None:
        self.state = state
        self.ctx = ctx
        self.key = ctx.idempotency_key
        self.outcome = "none"  # none | new | replay | attach
        self._earlier: ASGIApp | None = None
        self._handed_over = False
        self._publisher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> KeyClaim:
        if self.key is None:
            return self
        ctx, store = self.ctx, self.state.idempotency
        assert ctx.fingerprint is not None
        try:
            claim = await store.claim(ctx.tenant_id, self.key, ctx.fingerprint, ctx.request_id)
        except BackendUnavailable as exc:  # only keyed requests need the store, so only they are refused
            retry = str(self.state.admission.retry_after(exc.retry_after_s))
            raise refused(
                self.state,
                ctx.tenant_id,
                APIError(
                    503,
                    "idempotency records are unavailable; retry later, or send the request without Idempotency-Key",
                    "idempotency_unavailable",
                    "Idempotency-Key",
                    headers={"Retry-After": retry},
                ),
            ) from None
        if claim.outcome == "mismatch":
            raise APIError(
                422,
                "Idempotency-Key was already used with a different request body",
                "idempotency_key_reused",
                "Idempotency-Key",
            )
        self.outcome = claim.outcome
        replayed = {"Idempotent-Replayed": "true", "X-Request-Id": claim.request_id or ctx.request_id}
        if claim.outcome == "replay":
            assert claim.response is not None
            self._earlier = StoredResponseSender(claim.response, replayed)
        elif claim.outcome == "attach":
            local = self.state.runs.by_key.get((ctx.tenant_id, self.key))
            self._earlier = (
                RunResponse(local, replayed)
                if local is not None
                else FollowResponse(store.follow(ctx.tenant_id, self.key), bool(ctx.body.stream), replayed)
            )
        return self

    @property
    def earlier_answer(self) -> ASGIApp | None:
        """The response of the key's earlier request (replayed, or attached to while it runs), if any."""
        return self._earlier

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.outcome == "new" and not self._handed_over:  # refused (or cancelled) before a Run took it
            await self._abandon()

    def hand_over(self, run: Run) -> None:
        """The Run owns the claim from now: a stream's events are published as they appear; `settle` ends it."""
        self._handed_over = True
        if self.outcome != "new" or self.key is None or not run.spec.stream:
            return
        store, tenant_id, key = self.state.idempotency, self.ctx.tenant_id, self.key

        async def publish(chunk: str) -> None:
            await store.append(tenant_id, key, chunk)

        self._publisher = asyncio.create_task(publish_chunks(run, publish))

    @property
    def settled_by_nothing(self) -> bool:
        """True when `settle` has nothing to do (no key, or a replay or attach: the owner settles)."""
        return self.outcome != "new" or self.key is None

    async def settle(self, run: Run, outcome: Outcome) -> None:
        """At the run's end: keep the response for replays, or let the key go (a disconnect is no answer)."""
        if self.outcome != "new" or self.key is None:
            return
        if self._publisher is not None:
            try:
                await self._publisher
            except Exception:
                log.warning("publishing stream events of %s failed", self.ctx.request_id, exc_info=True)
        if run.final is not None and outcome.cancelled_by != "disconnect":
            await self.state.idempotency.finish(self.ctx.tenant_id, self.key, run.final)
        else:
            await self._abandon()

    async def _abandon(self) -> None:
        assert self.key is not None
        await self.state.idempotency.abandon(self.ctx.tenant_id, self.key)
