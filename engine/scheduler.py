"""Iteration-level scheduler in the unified-token-budget form (Orca + Sarathi-Serve + PagedAttention).

Every iteration each live request's `num_computed_tokens` catches up with its `num_tokens` as far as
the token budget allows: running decodes first (stall-free), then the rest of the budget goes to prefill
chunks in the fairness policy's order, continuing prompts and new admissions alike, while seats and KV
blocks allow (docs/fairness.md, "The step's budget").
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping
from operator import attrgetter

from engine.deadlines import Deadlines
from engine.family import Family, end_unforked, share_prompt
from engine.kv_cache import BlockPool, NoFreeBlock
from engine.request import FinishReason, Preemption, Request, RequestState, decodes_first
from engine.scheduler_output import ScheduledChunk, SchedulerConfig, SchedulerOutput, SwapFn
from fairness.base import SchedulingPolicy

__all__ = ["ScheduledChunk", "Scheduler", "SchedulerConfig", "SchedulerOutput", "SwapFn"]

_priority = attrgetter("meta.priority")  # `running` is kept sorted by it


class Scheduler:
    """Decides, every iteration, which tokens of which requests run, inside token and memory budgets."""

    def __init__(self, config: SchedulerConfig, pool: BlockPool, policy: SchedulingPolicy[Request]) -> None:
        self.config = config
        self.pool = pool
        self.policy = policy
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._deadlines = Deadlines()
        self._pending_aborts: dict[str, tuple[str, float]] = {}
        self._decoding: list[Request] = []  # decodes scheduled this step and not yet charged
        self._prefilling: list[Request] = []  # running prompts waiting for this step's share_budget
        self._admitting = True  # False once admission stopped in this step (blocks, static batching)
        self._reserved_seats = 0  # seats held for the unforked choices of running leaders (`Family`)
        self.families: dict[str, Family] = {}  # requests of n > 1 choices with a choice still live, by id
        self.iteration = 0
        # True once some request may carry a service_scale (LoRA adapters loaded, engine/lora/cost.py): its
        # decodes are then charged one by one, since `charge_decodes` charges every item one token's cost.
        self.scaled_charges = False
        # Whether the policy's head may be admitted now beyond seats and blocks (a LoRA adapter needs a device
        # slot: engine/lora/intake.py `admissible`). None: every head may. A head that may not is set aside
        # for the step (out of the policy's queue, back at the next step's start), so the requests behind
        # it, of other adapters or of none, are not held up by a slot they do not need.
        self.admissible: Callable[[Request], bool] | None = None
        self._set_aside: list[Request] = []
        self.waiting_for_blocks = 0
        self.block_waits_total = 0  # iterations in which admission stopped for want of free blocks
        self.swap_out: SwapFn | None = None
        self.swap_in: SwapFn | None = None
        # Counters for stats and metrics.
        self.preemptions_total = 0
        self.preemptions_by_kind: dict[tuple[str, str], int] = {}
        self.recomputed_tokens_total = 0
        self.swapped_bytes_total = 0
        self.deadline_misses = {"waiting": 0, "running": 0}
        self.deadline_wasted_tokens = 0

    # -- intake -----------------------------------------------------------------------------
    def add(self, request: Request, now: float | None = None) -> None:
        """Queue a validated request."""
        now = time.time() if now is None else now
        request.state = RequestState.WAITING
        self.requests[request.request_id] = request
        if request.family is not None:
            self.families[request.family.request_id] = request.family
        self.policy.add(request, now)
        if request.meta.deadline is not None:
            self._deadlines.add(request.meta.deadline, request.request_id)

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

    # -- one iteration ----------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Build the next iteration's batch."""
        now = time.time() if now is None else now
        self.iteration += 1
        out = SchedulerOutput(self.iteration)
        self.retire_aborted(out, now)
        self.expire_deadlines(now, out)
        self._return_set_aside(now)
        budget = self.schedule_decodes(now, out, self.config.max_num_batched_tokens)
        self.share_budget(now, out, budget)
        return out

    def retire_aborted(self, out: SchedulerOutput, now: float | None = None) -> None:
        """End every request whose cancellation arrived since the last iteration."""
        for request_id, (reason, _) in list(self._pending_aborts.items()):
            request = self.requests.get(request_id)
            if request is not None and not request.is_finished:
                finish = FinishReason.ERROR if reason == "error" else FinishReason.CANCELLED
                self.finish(request, finish, now)
                out.finished.append(request)
        self._pending_aborts.clear()

    def expire_deadlines(self, now: float, out: SchedulerOutput) -> None:
        """Requests past their absolute deadline leave now: queued ones unprefilled, running ones with their
        output; partial ones with tokens a step early, as `length` (engine/deadlines.py)."""
        for request, reason in self._deadlines.due(now, bool(self.running), self.requests.get):
            if reason is FinishReason.DEADLINE:
                self.deadline_misses["running" if request.state is RequestState.RUNNING else "waiting"] += 1
                self.deadline_wasted_tokens += request.num_computed_tokens
            self.finish(request, reason, now)
            out.finished.append(request)

    def schedule_decodes(self, now: float, out: SchedulerOutput, budget: int) -> int:
        """Give each running decode its next token (stall-free: decodes come before any prefill, so no prompt
        can starve them); preempt on block shortage. Running prompts are set aside for `share_budget`.

        `running` is kept sorted by class. With several classes present the more important ones are scheduled
        (and get blocks) first: each class's decodes, then the budget shared among its prompts and the waiting
        requests of classes up to it, then the next class; so a victim is never taken from a class above the
        one in need. With one class (the common case) this is all decodes, then `share_budget`.
        """
        self.waiting_for_blocks = 0
        self._admitting = not (self.config.request_batching and self.running)
        if not self.running:
            return budget
        ordered = decodes_first(self.running)
        # The decode fast path: one chunk, and a block check only when a block boundary is crossed (a running
        # request always holds exactly ceil(computed / block_size) blocks). Decodes are charged together
        # (`_charge_decodes`), before anything that reads or changes the counters: a preemption's victim
        # choice, a prefill chunk's charge. So every counter sees the same additions in the same order.
        block_size = self.pool.block_size
        max_model_len = self.config.max_model_len
        decoding = self._decoding
        prefilling = self._prefilling
        chunks = out.chunks
        decode_tokens = 0
        running_state = RequestState.RUNNING
        cls = ordered[0].meta.priority
        for request in ordered:
            if budget <= 0:
                break
            if request.meta.priority != cls:  # a less important class: the more important prompts go first
                self._charge_decodes()
                budget = self._share(now, out, budget, up_to=cls)
                cls = request.meta.priority
                if budget <= 0:
                    break
            if request.state is not running_state:
                continue  # preempted earlier in this iteration
            computed = request.num_computed_tokens
            output = request.output_token_ids
            remaining = len(request.prompt_token_ids) + len(output) - computed
            if remaining == 1 and output:
                in_flight = request.num_output_placeholders
                if in_flight and (
                    len(output) >= request.sampling.max_tokens or computed + 1 >= max_model_len
                ):
                    continue  # its token in flight ends it by length: nothing to speculate on
                # A choice of n > 1 may write into its family's shared partial block: `_grow` copies it first.
                grows = computed % block_size == 0 or request.family is not None
                if grows and not self._grow(request, computed + 1, out, now):
                    continue
                chunks.append(ScheduledChunk(request, computed, 1))
                (out.provisional if in_flight else decoding).append(request)
                decode_tokens += 1
                budget -= 1
            elif remaining > 0:
                prefilling.append(request)  # a prompt (or a recompute) under way: it competes in share_budget
        self._charge_decodes()
        out.decode_tokens += decode_tokens
        return budget

    def _charge_decodes(self) -> None:
        """Charge the decodes scheduled since the last call: one policy call for the batch, not one per request."""
        decoding = self._decoding
        if self.scaled_charges:
            self.charge_scaled_decodes(decoding)
        if decoding:
            cost = self.policy.charge_decodes(decoding)
            for request in decoding:
                request.charged_service += cost
            decoding.clear()

    def charge_scaled_decodes(self, decoding: list[Request]) -> None:
        """Charge the decodes of requests with a service_scale one by one (scaled), and drop them from the list."""
        if any(r.service_scale != 1.0 for r in decoding):
            for request in decoding:
                if request.service_scale != 1.0:
                    request.charged_service += self.policy.charge(request, 0, 1, 0)
            decoding[:] = [r for r in decoding if r.service_scale == 1.0]

    def _grow(self, request: Request, target: int, out: SchedulerOutput, now: float) -> bool:
        """Give `request` blocks for `target` tokens, preempting the policy's victims; False if it was preempted."""
        while not self._claim(request, target, out):
            self._charge_decodes()  # the victim is chosen on counters that include this step's decodes so far
            scheduled = {id(c.request) for c in out.chunks} | {id(r) for r in out.forked}
            candidates = [r for r in self.running if id(r) not in scheduled]
            victim = self.policy.victim(candidates, for_item=request) if candidates else None
            if victim is None:
                victim = request
            self.preempt(victim, "kv_blocks_exhausted", out, now)
            if victim is request:
                return False
        return True

    def _claim(self, request: Request, target: int, out: SchedulerOutput) -> bool:
        """Blocks for `target` tokens, the block the chunk writes first made the request's own if it is shared
        (copy on write: the copy goes into `out`, done before the forward); False if the pool is short."""
        try:
            copy = self.pool.copy_on_write(request.request_id, request.num_computed_tokens)
        except NoFreeBlock:
            return False
        if copy is not None:
            out.block_copies.append(copy)
        return self.pool.allocate(request.request_id, target)

    def share_budget(self, now: float, out: SchedulerOutput, budget: int) -> None:
        """Hand the budget the decodes left to prefill chunks in the policy's order (`_share`)."""
        self._share(now, out, budget)

    def _share(self, now: float, out: SchedulerOutput, budget: int, up_to: int | None = None) -> int:
        """Hand the budget the decodes left to prefill chunks, in the policy's order (`rank`): a running prompt's
        next chunk and the admission of `peek`'s head compete alike, so a prompt already admitted does not keep
        the budget from a less served key's waiting request (docs/fairness.md, "The step's budget"). Ties go
        to the running prompt (it was admitted first); within a key a running prompt always goes first, so a
        key cannot spread its queue over many half-done prompts. Admission also needs a seat and free blocks.
        `up_to`: only waiting requests of that class or a more important one (between classes of decodes).
        Returns the budget left.
        """
        prefilling = self._prefilling
        rank = self.policy.rank
        while budget > 0:
            head = self._head(now) if self._admitting else None
            if head is not None and up_to is not None and head.meta.priority > up_to:
                head = None
            first = min(prefilling, key=rank) if prefilling else None  # the earliest admitted among equals
            if head is not None and (first is None or rank(head) < rank(first)):
                used = self._admit(head, now, out, budget)
                if used is None:
                    self._admitting = False  # blocks ran out: running prompts may still go on
                budget -= used or 0
            elif first is not None:
                _remove(prefilling, first)
                if first.state is RequestState.RUNNING:
                    budget -= self._continue_prefill(first, now, out, budget)
            else:
                break
        if up_to is None:
            prefilling.clear()
        return budget

    def _head(self, now: float) -> Request | None:
        """The waiting request the policy would admit next, when a seat is free and it can be admitted now."""
        seats = self.config.max_num_seqs - len(self.running) - self._reserved_seats
        if seats <= 0:
            return None
        while (request := self.policy.peek(now)) is not None:
            if request.num_output_placeholders:
                return None  # (a victim whose last token is still in flight comes back once it lands)
            if request.family is not None and len(request.family.pending) >= seats:
                return None  # an unforked leader needs a seat for each of its choices
            if self.admissible is None or self.admissible(request):
                return request
            # Its adapter has no device slot (each holds a running request's): the next head may go instead.
            self.policy.remove(request)
            self._set_aside.append(request)
        return None

    def _return_set_aside(self, now: float) -> None:
        """Queue again the heads set aside last step for want of a device slot (those still live)."""
        set_aside, self._set_aside = self._set_aside, []
        for request in set_aside:
            if not request.is_finished:
                self.policy.add(request, now)

    def _continue_prefill(self, request: Request, now: float, out: SchedulerOutput, budget: int) -> int:
        """Schedule a running prompt's next chunk; the tokens it took (0 when it was preempted)."""
        computed = request.num_computed_tokens
        length = min(request.num_tokens - computed, budget)
        if length <= 0 or not self._grow(request, computed + length, out, now):
            return 0
        self._charge_decodes()
        self._add_chunk(out, request, length)
        return length

    def _admit(self, request: Request, now: float, out: SchedulerOutput, budget: int) -> int | None:
        """Admit `request` with a first chunk of at most `budget` tokens; the tokens it took, or None when the
        free blocks cannot hold its whole (re)prefill (admission stops for this step)."""
        if request.state is RequestState.SWAPPED:
            if not self._swap_back(request):
                self._wait_for_blocks()
                return None
            self.policy.pop(request)
            self._enter_running(request)
            return 0
        chain = request.cache_chain(self.pool.block_size)  # ([], []) with prefix caching off
        hit_ids, hit_hashes = self.pool.match_prefix(request.all_token_ids, *chain)
        cached = len(hit_ids) * self.pool.block_size
        length = min(request.num_tokens - cached, budget)
        blocks_from_free = sum(1 for b in hit_ids if self.pool.blocks[b].ref_count == 0)
        # Admit only when the whole (re)prefill fits beside the watermark, not just its first chunk:
        # a prompt admitted into memory it cannot finish in is preempted again, and recompute thrashes.
        new_blocks = -(-request.num_tokens // self.pool.block_size) - len(hit_ids)
        family = request.family
        # Each pending choice needs a block of its own: for the partial last prompt block, copied when first
        # written (none when the prompt fills its blocks); for the whole prompt with sliding-window layers.
        if family is not None and family.pending:
            size = self.pool.block_size
            new_blocks += len(family.pending) * (
                -(-request.num_prompt_tokens // size) - family.fork_at // size
            )
        if blocks_from_free + new_blocks > self.pool.num_free - self.config.watermark_blocks:
            self._wait_for_blocks()
            return None
        self.policy.pop(request)
        self.pool.attach_prefix(request.request_id, hit_ids, hit_hashes)
        allocated = self.pool.allocate(request.request_id, cached + length)
        assert allocated, "admission checked free blocks"
        fresh = request.num_computed_tokens == 0 and not request.preemptions
        request.num_computed_tokens = cached
        if fresh:
            request.num_cached_tokens = cached
            request.num_public_cached_tokens = min(len(hit_ids), chain[1]) * self.pool.block_size
            if cached:
                out.cached_tokens += cached
                request.charged_service += self.policy.charge(request, 0, 0, cached)
                request.num_charged_prompt_tokens = cached
        if request.first_scheduled_time is None:
            request.first_scheduled_time = now
        request.state = RequestState.RUNNING
        self._enter_running(request)
        self._add_chunk(out, request, length)
        if family is not None and family.pending and cached >= family.fork_at:
            self._fork(family, now, into_step=True)
        return length

    def _wait_for_blocks(self) -> None:
        self.waiting_for_blocks = len(self.policy)
        self.block_waits_total += 1

    def _enter_running(self, request: Request) -> None:
        # Sorted by class (stable: after its equals), so the hot path can tell "one class" in O(1).
        running = self.running
        if not running or running[-1].meta.priority <= request.meta.priority:
            running.append(request)
        else:
            bisect.insort_right(running, request, key=_priority)
        if request.family is not None and request.choice_index == 0:
            self._reserved_seats += len(request.family.pending)

    def _leave_running(self, request: Request) -> None:
        # By identity: Request is a dataclass, so list.remove would compare every field of every peer.
        running = self.running
        for i in range(len(running) - 1, -1, -1):
            if running[i] is request:
                del running[i]
                if request.family is not None and request.choice_index == 0:
                    self._reserved_seats -= len(request.family.pending)
                return

    def _add_chunk(self, out: SchedulerOutput, request: Request, length: int) -> None:
        start = request.num_computed_tokens
        out.chunks.append(ScheduledChunk(request, start, length))
        # Charge as tokens are scheduled: prompt positions once (recompute is free), each new token once.
        prompt_end = request.num_prompt_tokens
        new_prompt = max(0, min(start + length, prompt_end) - max(start, request.num_charged_prompt_tokens))
        request.num_charged_prompt_tokens = max(
            request.num_charged_prompt_tokens, min(start + length, prompt_end)
        )
        is_decode_step = length == 1 and start >= prompt_end
        recomputed = max(0, min(start + length, request.recompute_until) - start)
        if recomputed:
            request.recomputed_tokens += recomputed
            self.recomputed_tokens_total += recomputed
        out.decode_tokens += int(is_decode_step)
        out.prefill_tokens += length - int(is_decode_step)
        # Every sampling chunk yields one new output token: that is the decode charge.
        decode = int(start + length == request.num_tokens)
        if decode and request.num_output_placeholders:
            out.provisional.append(request)
            decode = 0
        if new_prompt or decode:
            request.charged_service += self.policy.charge(request, new_prompt, decode, 0)
        family = request.family
        if family is not None and family.pending and family.fork_at and start + length == family.fork_at:
            self._fork_sampled(family, out)  # the leader's prompt is complete in this step's forward

    # -- preemption -------------------------------------------------------------------------
    def preempt(self, victim: Request, reason: str, out: SchedulerOutput, now: float) -> None:
        """Take `victim`'s blocks: swap them out when configured and possible, else drop them for recompute."""
        t0 = time.perf_counter()
        self._leave_running(victim)
        _remove(self._prefilling, victim)  # re-admitted this step, it must not get a second chunk too
        record = Preemption(reason=reason, mode="recompute", iteration=self.iteration)
        moved = self.swap_out(victim) if self.config.preemption_mode == "swap" and self.swap_out else -1
        if moved >= 0:
            record.mode, record.bytes_swapped = "swap", moved
            self.swapped_bytes_total += moved
            self.pool.free(victim.request_id)
            victim.state = RequestState.SWAPPED
        else:
            record.tokens_recomputed = victim.num_computed_tokens
            victim.recompute_until = max(victim.recompute_until, victim.num_computed_tokens)
            self.pool.free(victim.request_id)
            victim.num_computed_tokens = 0
            victim.state = RequestState.PREEMPTED
        record.seconds = time.perf_counter() - t0
        victim.preemptions.append(record)
        self.preemptions_total += 1
        kind = (record.reason, record.mode)
        self.preemptions_by_kind[kind] = self.preemptions_by_kind.get(kind, 0) + 1
        self.policy.add(victim, now, front=True)
        out.preempted.append((victim, record))

    def _swap_back(self, request: Request) -> bool:
        need = -(-request.num_computed_tokens // self.pool.block_size)
        if need > self.pool.num_free - self.config.watermark_blocks:
            return False
        assert self.swap_in is not None
        self.pool.allocate(request.request_id, request.num_computed_tokens)
        moved = self.swap_in(request)
        self.swapped_bytes_total += moved
        request.state = RequestState.RUNNING
        return True

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
        reference count and runs from there (engine/family.py; all of the prompt's, or none with
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
        elif request.state in (RequestState.WAITING, RequestState.PREEMPTED, RequestState.SWAPPED):
            self.policy.remove(request)
        self.pool.free(request.request_id)
        self.policy.finish(request)
        request.state = RequestState.FINISHED
        request.finish_reason = reason
        request.finished_time = time.time() if now is None else now
        self.requests.pop(request.request_id, None)
        family = request.family
        if family is not None:
            if family.pending:
                end_unforked(family, reason, request.finished_time)
            if all(m.is_finished for m in family.members):
                self.families.pop(family.request_id, None)


def _remove(requests: list[Request], request: Request) -> None:
    """Drop `request` from `requests` by identity (Request is a dataclass: `list.remove` compares fields)."""
    for i, r in enumerate(requests):
        if r is request:
            del requests[i]
            return
