"""Iteration-level scheduler in the unified-token-budget form (Orca + Sarathi-Serve + PagedAttention).

Every iteration each live request's `num_computed_tokens` catches up with its `num_tokens` as far as
the token budget allows: running decodes first (stall-free), then the rest of the budget goes to prefill
chunks in the fairness policy's order, continuing prompts and new admissions alike, while seats and KV
blocks allow (docs/fairness.md, "The step's budget").
"""

from __future__ import annotations

import time

from engine.core.family import (
    forks_after_chunk,
    forks_at_admission,
    unforked,
    unforked_blocks,
)
from engine.core.kv_cache import NoFreeBlock
from engine.core.request import FinishReason, Preemption, Request, RequestState, decodes_first
from engine.core.scheduler_output import AdapterSlots, ScheduledChunk, SchedulerConfig, SchedulerOutput, Swap
from engine.core.scheduler_state import SchedulerState

__all__ = ["AdapterSlots", "ScheduledChunk", "Scheduler", "SchedulerConfig", "SchedulerOutput", "Swap"]

# A decode's work is charged once this many new-token equivalents are owed (engine/core/step_cost.py): one policy
# call every few steps per request rather than every step; at most this much goes uncharged per request.
_WORK_QUANTUM = 8.0
# The share of the step's cost budget the step's first prefill chunk may always spend, whatever the decodes
# took: decodes are stall-free and may spend the whole budget on a slow device, and the least served key's
# prompt must still enter every step (docs/fairness.md, "The step's cost").
_PREFILL_FLOOR = 0.25


class Scheduler(SchedulerState):
    """Decides, every iteration, which tokens of which requests run, inside token and memory budgets (the
    requests themselves, intake, results and ends: engine/core/scheduler_state.py)."""

    # -- one iteration ----------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> SchedulerOutput:
        """Build the next iteration's batch."""
        now = time.time() if now is None else now
        self.iteration += 1
        out = SchedulerOutput(self.iteration)
        if self.waits:  # (polled also with none held: a load whose requests left is still landed and charged)
            self.wake_held(now)
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
        output; partial ones with tokens a step early, as `length` (engine/core/deadlines.py)."""
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
        # The step's cost budget (engine/core/step_cost.py): the reference step's cost. Decodes stay stall-free
        # (bounded by the token budget and the seats only) but spend it, and prefill chunks get what is left.
        self._cost_left = self.config.step_cost.budget(self.config.max_num_batched_tokens)
        self._prefill_granted = False
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
        step_cost = self.config.step_cost
        context, sequence = step_cost.context, step_cost.sequence
        charge_work = self._charges_work
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
                # (family.py's decisions, inlined on this hot path: a choice may write a block it shares)
                grows = computed % block_size == 0 or request.family is not None
                if grows and not self._grow(request, computed + 1, out, now):
                    continue
                chunks.append(ScheduledChunk(request, computed, 1))
                work = context * computed + sequence
                self._cost_left -= 1.0 + work
                if in_flight:
                    out.provisional.append(request)
                    request.step_work_pending = work  # charged with its decode when the step commits
                else:
                    decoding.append(request)
                    if charge_work:
                        self.charge_work(request, work)
                decode_tokens += 1
                budget -= 1
            elif remaining > 0:
                prefilling.append(request)  # a prompt (or a recompute) under way: it competes in share_budget
        self._charge_decodes()
        out.decode_tokens += decode_tokens
        return budget

    @property
    def _charges_work(self) -> bool:
        """Whether chunks are charged their work beyond new tokens (engine/core/step_cost.py)."""
        return self.config.charge_step_work and not self.config.step_cost.counts_tokens_only

    def charge_work(self, request: Request, work: float, now: bool = False) -> int:
        """Owe `request`'s fairness key `work` new-token equivalents (cached context attended, the sequence's
        constant) and charge the whole tokens owed, as prefill at `w_in`, once they reach `_WORK_QUANTUM`
        (or at once with `now`), so a decode does not cost a policy call every step. Returns the tokens
        charged here (the caller may fold them into a charge of its own instead: `now` then returns them
        uncharged)."""
        owed = request.step_work_owed + work
        whole = int(owed) if now or owed >= _WORK_QUANTUM else 0
        request.step_work_owed = owed - whole
        if whole and not now:
            request.charged_service += self.policy.charge(request, whole, 0, 0)
        return whole

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
        # Both budgets: tokens (the forward's shape) and cost (its time). The step's first prefill chunk may
        # always spend `_PREFILL_FLOOR` of the budget, whatever the decodes took, and at least one token: so
        # the policy's first pick enters every step, and no request waits forever for a step of its own.
        while budget > 0 and (self._cost_left > 0 or not self._prefill_granted):
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
            if unforked(request) >= seats:
                return None  # an unforked leader needs a seat for each of its choices
            if self.slots is None or self.slots.admissible(self.running, request):
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
        length = self._fit(computed, min(request.num_tokens - computed, budget))
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
        length = self._fit(cached, min(request.num_tokens - cached, budget))
        if length <= 0:
            self._admitting = False  # the step's cost budget is spent: the head goes first next step
            return 0
        blocks_from_free = sum(1 for b in hit_ids if self.pool.blocks[b].ref_count == 0)
        # Admit only when the whole (re)prefill fits beside the watermark, not just its first chunk:
        # a prompt admitted into memory it cannot finish in is preempted again, and recompute thrashes.
        new_blocks = -(-request.num_tokens // self.pool.block_size) - len(hit_ids)
        new_blocks += unforked_blocks(request, self.pool.block_size)
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
        if (family := forks_at_admission(request, cached)) is not None:
            self._fork(family, now, into_step=True)
        return length

    def _fit(self, start: int, most: int) -> int:
        """The tokens (at most `most`) a chunk starting after `start` cached positions may take from what is
        left of the step's cost budget; for the step's first prefill chunk, at least `_PREFILL_FLOOR` of the
        budget's worth and at least one token (see `_share`)."""
        cost = self.config.step_cost
        if self._prefill_granted:
            return cost.fit(start, self._cost_left, most)
        floor = _PREFILL_FLOOR * cost.budget(self.config.max_num_batched_tokens)
        return max(cost.fit(start, max(self._cost_left, floor), most), min(most, 1))

    def _wait_for_blocks(self) -> None:
        self.waiting_for_blocks = len(self.policy)
        self.block_waits_total += 1

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
        step_cost = self.config.step_cost
        self._cost_left -= step_cost.chunk(start, length)
        self._prefill_granted = True
        # The chunk's work beyond its new tokens, charged with them; recomputed positions are free, as their
        # prompt charge is.
        work = 0
        if length > recomputed and self._charges_work:
            fresh = start + recomputed
            owed = step_cost.work(fresh, length - recomputed, start + length == request.num_tokens)
            work = self.charge_work(request, owed, now=True)
        if recomputed:
            request.recomputed_tokens += recomputed
            self.recomputed_tokens_total += recomputed
        out.decode_tokens += int(is_decode_step)
        out.prefill_tokens += length - int(is_decode_step)
        # Every sampling chunk yields one new output token: that is the decode charge.
        decode = int(start + length == request.num_tokens)
        if decode and request.num_output_placeholders:
            out.provisional.append(request)
            request.step_work_pending = 0.0  # this chunk's work is charged below, with its prompt
            decode = 0
        if new_prompt or decode or work:
            request.charged_service += self.policy.charge(request, new_prompt + work, decode, 0)
        if (family := forks_after_chunk(request, start + length)) is not None:
            self._fork_sampled(family, out)  # the leader's prompt is complete in this step's forward

    # -- preemption -------------------------------------------------------------------------
    def preempt(self, victim: Request, reason: str, out: SchedulerOutput, now: float) -> None:
        """Take `victim`'s blocks: swap them out when configured and possible, else drop them for recompute."""
        t0 = time.perf_counter()
        self._leave_running(victim)
        _remove(self._prefilling, victim)  # re-admitted this step, it must not get a second chunk too
        record = Preemption(reason=reason, mode="recompute", iteration=self.iteration)
        moved = self.swap.swap_out(victim) if self.config.preemption_mode == "swap" and self.swap else -1
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
        assert self.swap is not None
        self.pool.allocate(request.request_id, request.num_computed_tokens)
        moved = self.swap.swap_in(request)
        self.swapped_bytes_total += moved
        request.state = RequestState.RUNNING
        return True


def _remove(requests: list[Request], request: Request) -> None:
    """Drop `request` from `requests` by identity (Request is a dataclass: `list.remove` compares fields)."""
    for i, r in enumerate(requests):
        if r is request:
            del requests[i]
            return
