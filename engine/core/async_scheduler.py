"""The scheduler of async scheduling: step N+1 is scheduled while step N's forward still runs.

Like vLLM V1's `AsyncScheduler`, it is the plain `Scheduler` with two methods overridden; the engine
loop is the same for both (schedule → execute → update → outputs, engine/serving/llm_engine.py), and the
executor (engine/worker/overlap.py) returns step N's samples while it runs step N+1. `update(N, samples)`
lands N's tokens in their placeholders; `schedule()` first commits the step it scheduled last (after
that step's predecessor landed and its outputs, stop strings included, went out), then schedules:

- N+1's schedule sees each request that N samples as already holding that token: the last output id is
  a placeholder, -(1 + its row among N's samples), and its computed count is N's end. The forward puts
  N's sampled id in its place (ModelRunner._to_device), so the host never waits for it.
- A request that N ends (EOS, a stop token or string, max_tokens, its sampler failing) had a decode in
  N+1. That token is computed and thrown away, and never charged: N+1's decodes of requests in flight
  are `provisional` and charged at commit, for the requests that go on. Requests that their token in
  flight ends by length are not scheduled at all.
- An abort or a deadline applied by N+1's schedule ends a request whose token is in flight: that token
  still lands and goes out with the final output.

What differs from the plain loop is timing only: N+1 is scheduled before N's finished requests free
their seats and blocks, so admissions and preemptions can come a step later, and victims and admission
order read counters that do not yet hold the provisional decodes. Tokens and charges are the same
(tests/engine/test_async_scheduling.py, tests/sim/test_async_sim.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from engine.core.request import Request
from engine.core.scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """A `Scheduler` whose `update` lands the step before the one it last scheduled, then commits that one."""

    _pending: SchedulerOutput | None = None  # scheduled, not yet committed

    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Commit the step scheduled last, then the plain schedule, remembering which requests it samples
        in the forward's row order."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._commit(pending)
        out = super().schedule(now)
        out.sampling = [c.request for c in out.chunks if c.samples] + out.forked  # the runner's row order
        self._pending = out
        return out

    def update(
        self,
        out: SchedulerOutput,
        sampled: Mapping[str, int],
        eos_token_ids: set[int] | frozenset[int],
        now: float | None = None,
    ) -> list[Request]:
        """Land `out`'s samples in their placeholders (a request missing from `sampled` failed: no token);
        returns the requests whose token stopped them."""
        now = time.time() if now is None else now
        land = self._land
        return [
            request
            for request in out.sampling
            if request.num_output_placeholders and land(request, sampled, eos_token_ids, now)
        ]

    def _land(
        self,
        request: Request,
        sampled: Mapping[str, int],
        eos_token_ids: set[int] | frozenset[int],
        now: float,
    ) -> bool:
        """Put the sampled token in its placeholder; True when a token-level stop ended the request."""
        output = request.output_token_ids
        request.num_output_placeholders = 0
        token = sampled.get(request.request_id)
        if token is None:
            output.pop()  # its own sampling raised: it ended with no token, as without overlap
            return False
        output[-1] = token
        if request.first_token_time is None:
            request.first_token_time = now
        if request.is_finished:
            return False  # ended by an abort or its deadline while its token was in flight: the token still goes out
        return self.check_stop(request, token, eos_token_ids, now)

    def _commit(self, out: SchedulerOutput) -> None:
        """The step's results are now certain to be wanted for the requests still live: charge their
        provisional decodes, advance them, and put a placeholder where each sampled token will land."""
        survivors = [r for r in out.provisional if not r.is_finished]
        if self._charges_work:  # their decodes' work beyond the new token, as a plain step charges it
            for request in survivors:
                self.charge_work(request, request.step_work_pending)
        if self.scaled_charges:
            self.charge_scaled_decodes(survivors)
        if survivors:
            cost = self.policy.charge_decodes(survivors)
            for request in survivors:
                request.charged_service += cost
        discarded = 0
        for chunk in out.chunks:
            if chunk.request.is_finished:
                discarded += chunk.length
            else:
                self.advance(chunk)
        for row, request in enumerate(out.sampling):
            if not request.is_finished:
                request.output_token_ids.append(-1 - row)
                request.num_output_placeholders = 1
        out.decode_tokens -= discarded
        out.discarded_tokens = discarded
