"""The scheduler's requests and what happens to them outside the budget decisions of `schedule()`.

`SchedulerState` holds the live requests, the running set (sorted by class), the families of n > 1 choices
and the counters; it takes requests in (`add`, `abort`), lands a forward's results (`update`, `advance`),
forks choices (`_fork`) and ends requests (`check_stop`, `finish`). engine/core/scheduler.py's `Scheduler` adds
the step itself: which tokens of which requests run, inside the token and memory budgets. Split so that
each file reads as one concern; they are one object.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from operator import attrgetter

from engine.core.deadlines import Deadlines
from engine.core.errors import InvalidRequestError
from engine.core.family import Family, choices_of, end_choice, share_prompt, unforked
from engine.core.kv_cache import BlockPool
from engine.core.request import FinishReason, Request, RequestState
from engine.core.scheduler_output import AdapterSlots, ScheduledChunk, SchedulerConfig, SchedulerOutput, Swap
from engine.core.waits import HELD_STATES, Wait
from fairness.base import SchedulingPolicy

_priority = attrgetter("meta.priority")  # `running` is kept sorted by it


class SchedulerState:
    """The live requests of one scheduler, and everything done to them between its steps' decisions."""

    def __init__(
        self,
        config: SchedulerConfig,
        pool: BlockPool,
        policy: SchedulingPolicy[Request],
        slots: AdapterSlots | None = None,
        swap: Swap | None = None,
        waits: Sequence[Wait] = (),
    ) -> None:
        self.config = config
        self.pool = pool
        self.policy = policy
        # LoRA's device slots (engine/worker/lora/intake.py): a head whose adapter can take no slot now is set aside
        # for the step (out of the policy's queue, back at the next step's start), so the requests behind it,
        # of other adapters or of none, are not held up by a slot they do not need. None: every head may.
        self.slots = slots
        # Swap preemption's host side (engine/worker/swap.py); None: a victim is always recomputed.
        self.swap = swap
        # What a request may wait for before it is queued, in order (engine/core/waits.py): its adapter, then
        # its grammar. A held request is live (in `requests`) in its wait's state, outside the policy's queue.
        self.waits = tuple(waits)
        self._held: dict[str, Wait | None] = {}  # held request -> its wait (None: held from outside, `hold`)
        self._refused: list[tuple[Request, InvalidRequestError]] = []
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._deadlines = Deadlines()
        self._pending_aborts: dict[str, tuple[str, float]] = {}
        self._decoding: list[Request] = []  # decodes scheduled this step and not yet charged
        self._prefilling: list[Request] = []  # running prompts waiting for this step's share_budget
        self._cost_left = 0.0  # what is left of this step's cost budget (engine/core/step_cost.py)
        self._prefill_granted = False  # whether this step holds a prefill chunk yet
        self._admitting = True  # False once admission stopped in this step (blocks, static batching)
        self._reserved_seats = 0  # seats held for the unforked choices of running leaders (`Family`)
        self.families: dict[str, Family] = {}  # requests of n > 1 choices with a choice still live, by id
        self.iteration = 0
        self._set_aside: list[Request] = []
        self.waiting_for_blocks = 0
        self.block_waits_total = 0  # iterations in which admission stopped for want of free blocks
        # Counters for stats and metrics.
        self.preemptions_total = 0
        self.preemptions_by_kind: dict[tuple[str, str], int] = {}
        self.recomputed_tokens_total = 0
        self.swapped_bytes_total = 0
        self.deadline_misses = {"waiting": 0, "running": 0}
        self.deadline_wasted_tokens = 0

    @property
    def scaled_charges(self) -> bool:
        """True once some request may carry a service_scale (LoRA adapters loaded, engine/worker/lora/cost.py): its
        decodes are then charged one by one, since `charge_decodes` charges every item one token's cost."""
        return self.slots is not None and self.slots.loaded_any

    # -- intake -----------------------------------------------------------------------------
    def add(self, request: Request, now: float | None = None) -> None:
        """Take a validated request in: queued for admission, or held in the first of `waits` it needs (live,
        in that wait's state, outside the policy's queue). InvalidRequestError from a wait (what it needs is
        known to fail) takes nothing in."""
        now = time.time() if now is None else now
        self._pass_waits(request, now, 0)
        self.requests[request.request_id] = request
        if request.family is not None:
            self.families[request.family.request_id] = request.family
        if request.meta.deadline is not None:
            self._deadlines.add(request.meta.deadline, request.request_id)

    def _pass_waits(self, request: Request, now: float, start: int) -> None:
        """Hold `request` in the first wait from `start` on that needs to, else queue it. A wait raising
        undoes what the waits before it attached."""
        members = choices_of(request)
        for i in range(start, len(self.waits)):
            wait = self.waits[i]
            try:
                held = wait.hold(request, members)
            except InvalidRequestError:
                for earlier in self.waits[:i]:
                    for member in members:
                        earlier.forget(member.request_id)
                raise
            if held:
                request.state = wait.state
                self._held[request.request_id] = wait
                return
        self._queue(request, now)

    def _queue(self, request: Request, now: float) -> None:
        # A request that arrives with computed KV (a decode engine's pull, staged by the runner) enters as a
        # swapped one: its blocks come in when it is admitted.
        request.state = RequestState.SWAPPED if request.num_computed_tokens else RequestState.WAITING
        self.policy.add(request, now)

    def hold(self, request: Request, state: RequestState) -> None:
        """Take a validated request in held in `state` by a wait outside the scheduler (a decode engine's KV
        pull, engine/serving/disagg.py): live, outside the policy's queue, until `queue_held` (or `unhold`)."""
        assert state in HELD_STATES
        self._held[request.request_id] = None
        self.requests[request.request_id] = request
        request.state = state
        if request.meta.deadline is not None:
            self._deadlines.add(request.meta.deadline, request.request_id)

    def queue_held(self, request: Request, now: float | None = None) -> None:
        """The outside wait of a request taken in by `hold` is over: on through `waits`, then queued."""
        if self._unhold(request.request_id) is None:
            return
        now = time.time() if now is None else now
        try:
            self._pass_waits(request, now, 0)
        except InvalidRequestError as exc:
            self._refuse(request, exc, now)

    def unhold(self, request_id: str) -> Request | None:
        """Drop a request held from outside whose wait failed, with no output (its caller answers it)."""
        request = self._unhold(request_id)
        if request is not None:
            del self.requests[request_id]
            request.state = RequestState.FINISHED
        return request

    def _unhold(self, request_id: str) -> Request | None:
        request = self.requests.get(request_id)
        if request is None or request_id not in self._held or self._held[request_id] is not None:
            return None
        del self._held[request_id]
        return request

    def wake_held(self, now: float) -> None:
        """Pass on the held requests whose wait ended since the last step (to the next wait, or the queue),
        and refuse those whose wait failed (`take_refused`)."""
        for i, wait in enumerate(self.waits):
            for request in wait.admit():
                if self._held.pop(request.request_id, None) is not wait:
                    continue
                try:
                    self._pass_waits(request, now, i + 1)
                except InvalidRequestError as exc:
                    self._refuse(request, exc, now)
            for request, refusal in wait.take_refused():
                if self._held.pop(request.request_id, None) is wait:
                    self._refuse(request, refusal, now)

    def _refuse(self, request: Request, exc: InvalidRequestError, now: float) -> None:
        """End a held request as refused: no output of its own; the engine answers it with `exc` (a 400). What
        any wait attached to its choices goes."""
        for member in choices_of(request):
            for wait in self.waits:
                wait.forget(member.request_id)
        request.state = RequestState.FINISHED
        request.finish_reason = FinishReason.REJECTED
        request.finished_time = now
        self.requests.pop(request.request_id, None)
        if request.family is not None:
            self.families.pop(request.family.request_id, None)
        self._pending_aborts.pop(request.request_id, None)
        self._refused.append((request, exc))

    def take_refused(self) -> list[tuple[Request, InvalidRequestError]]:
        """Requests refused since the last call because their wait failed (an adapter's load, a grammar's
        compile): once per request, whatever its n."""
        refused, self._refused = self._refused, []
        return refused

    @property
    def num_held(self) -> int:
        """Requests waiting for their adapter, grammar or KV."""
        return len(self._held)

    def abort(self, request_id: str, reason: str = "cancelled", signal_time: float | None = None) -> bool:
        """Mark a live request for cancellation at the next iteration boundary."""
        t = time.time() if signal_time is None else signal_time
        family = self.families.get(request_id)
        if family is not None:  # aborting a request aborts every live choice of it (the leader may be done)
            live = [m for m in family.members if m.request_id in self.requests]
            for member in live:
                self._mark_abort(member, reason, t)
            return bool(live)
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return False
        self._mark_abort(request, reason, t)
        return True

    def _mark_abort(self, request: Request, reason: str, t: float) -> None:
        request_id = request.request_id
        self._pending_aborts.setdefault(request_id, (reason, t))
        if request.cancel_time is None:
            request.cancel_time = t
            request.cancel_state = request.phase

    @property
    def num_waiting(self) -> int:
        """Requests queued for admission (including preempted ones, and heads set aside for a slot)."""
        return len(self.policy) + len(self._set_aside)

    def has_unfinished(self) -> bool:
        """True while any request is queued or running."""
        return bool(self.requests)

    def _enter_running(self, request: Request) -> None:
        # Sorted by class (stable: after its equals), so the hot path can tell "one class" in O(1).
        running = self.running
        if not running or running[-1].meta.priority <= request.meta.priority:
            running.append(request)
        else:
            bisect.insort_right(running, request, key=_priority)
        self._reserved_seats += unforked(request)

    def _leave_running(self, request: Request) -> None:
        # By identity: Request is a dataclass, so list.remove would compare every field of every peer.
        running = self.running
        for i in range(len(running) - 1, -1, -1):
            if running[i] is request:
                del running[i]
                self._reserved_seats -= unforked(request)
                return

    # -- after the forward pass -------------------------------------------------------------
    def update(
        self,
        out: SchedulerOutput,
        sampled: Mapping[str, int],
        eos_token_ids: set[int] | frozenset[int],
        now: float | None = None,
    ) -> list[Request]:
        """Advance computed counts, append sampled tokens, and end what a token stops; returns the requests
        that ended. Stop strings are the engine's (they need text); charging happened at `schedule`."""
        finished: list[Request] = []
        now = time.time() if now is None else now
        max_model_len = self.config.max_model_len
        finished_state = RequestState.FINISHED
        advance = self.advance
        for chunk in out.chunks:
            request = chunk.request
            if request.state is finished_state:
                continue
            computed = advance(chunk)
            output = request.output_token_ids
            if computed != len(request.prompt_token_ids) + len(output):
                continue  # a prefill chunk that does not reach the end samples nothing
            token = sampled[request.request_id]
            output.append(token)
            if request.first_token_time is None:
                request.first_token_time = now
            params = request.sampling
            if (  # the common case, no stop, without a call
                len(output) >= params.max_tokens
                or computed + 1 >= max_model_len
                or (token in eos_token_ids and not params.ignore_eos)
                or token in params.stop_token_ids
            ) and self.check_stop(request, token, eos_token_ids, now):
                finished.append(request)
        for follower in out.forked:  # choices forked this step: their first token, from the leader's row
            first = sampled.get(follower.request_id)
            if follower.state is finished_state or first is None:
                continue
            follower.output_token_ids.append(first)
            follower.first_token_time = now
            if self.check_stop(follower, first, eos_token_ids, now):
                finished.append(follower)
        return finished

    def advance(self, chunk: ScheduledChunk) -> int:
        """The chunk ran: its request's computed count moves to the chunk's end and full blocks are hashed
        for the prefix cache (a one-token chunk fills one only on a block boundary). Returns the count."""
        request = chunk.request
        computed = request.num_computed_tokens = chunk.start + chunk.length
        pool = self.pool
        # A block filled (by a decode step: rarely).
        if pool.enable_prefix_caching and (chunk.length > 1 or computed % pool.block_size == 0):
            root, public = request.cache_chain(pool.block_size)
            pool.commit_full_blocks(request.request_id, request.all_token_ids, computed, root, public)
        return computed

    # -- several choices (n > 1) ------------------------------------------------------------
    def _fork_sampled(self, family: Family, out: SchedulerOutput) -> None:
        """The leader's last prompt chunk is in `out`: every pending choice takes all its prompt blocks by
        reference (the partial last one copied when first written: `_claim`) and samples its first token
        from the leader's last row of this step (`out.forked`), charged one decode; the prompt was the
        leader's to compute and be charged."""
        followers = list(family.pending)
        self._fork(family, family.leader.first_scheduled_time or time.time())
        for follower in followers:
            follower.charged_service += self.policy.charge(follower, 0, 1, 0)
        out.forked.extend(followers)

    def _fork(self, family: Family, now: float, into_step: bool = False) -> None:
        """The leader's KV holds the prompt up to `fork_at`: every pending choice takes those blocks by
        reference count and runs from there (engine/core/family.py; all of the prompt's, or none with
        sliding-window layers). `into_step`: forked while this step's budget is being shared, so the
        choices compete for it now."""
        followers = family.pending
        self._reserved_seats -= len(followers)
        family.pending = []
        share_prompt(self.pool, family, followers)
        aborted = self._pending_aborts.get(family.leader.request_id)
        for follower in followers:
            follower.first_scheduled_time = follower.first_scheduled_time or now
            self.requests[follower.request_id] = follower
            if follower.meta.deadline is not None:
                self._deadlines.add(follower.meta.deadline, follower.request_id)
            self._enter_running(follower)
            if into_step:
                self._prefilling.append(follower)
            if aborted is not None:  # the request was aborted before the fork landed: every choice goes
                self._mark_abort(follower, *aborted)

    def check_stop(
        self, request: Request, token: int, eos_token_ids: set[int] | frozenset[int], now: float
    ) -> bool:
        """End `request` if `token`, just appended, stops it; True when it did."""
        reason = request.stop_reason(token, eos_token_ids, self.config.max_model_len)
        if reason is None:
            return False
        self.finish(request, reason, now)
        return True

    def finish(self, request: Request, reason: FinishReason, now: float | None = None) -> None:
        """End a request wherever it is and free its blocks at once."""
        if request.is_finished:
            return
        if request.state is RequestState.RUNNING:
            self._leave_running(request)
        elif request.state in HELD_STATES:
            wait = self._held.pop(request.request_id, None)
            if wait is not None:
                wait.release(request.request_id)
        elif request.state in (RequestState.WAITING, RequestState.PREEMPTED, RequestState.SWAPPED):
            self.policy.remove(request)
        self.pool.free(request.request_id)
        self.policy.finish(request)
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.finished_time = time.time() if now is None else now
        self.requests.pop(request.request_id, None)
        if end_choice(request, request.finished_time):
            assert request.family is not None
            self.families.pop(request.family.request_id, None)
