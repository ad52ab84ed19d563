"""GrammarIntake: the wait of a grammar request for its compile (a `Wait`, engine/core/waits.py), and how its
grammar CPU is charged as service.

A request whose grammar is cached gets its matcher at once and is queued as any other. Otherwise the
scheduler holds it in state `WAITING_FOR_GRAMMAR`: live, but with no batch seat, no KV block and no place
in the fairness order, until `admit` (polled by the scheduler at the start of every step) finds its
compile done. A failed or timed-out compile refuses that request alone; the engine loop sends the refusal
(a 400) to its front.

Service: grammar CPU time (the compile, once per compiled grammar, and every mask) is charged to the
request's fairness key as prefill tokens, one per `mask_us_per_token` microseconds, the fraction carried
to the next charge. A tenant whose schemas cost more mask time is served correspondingly less. The
gateway's preprocessing CPU (`RequestMeta.preprocess_cpu_s`: the body's validation, the chat's rendering,
the tokenising) goes the same way, once the request is live in the scheduler (`note_preprocessing`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from engine.core.errors import InvalidRequestError
from engine.core.request import Request, RequestState
from engine.core.waits import HELD_STATES
from engine.worker.grammar.backend import Backend
from engine.worker.grammar.compiler import GrammarCompiler
from engine.worker.grammar.config import GrammarConfig
from engine.worker.grammar.masks import GrammarMasks
from fairness.base import SchedulingPolicy


class GrammarIntake:
    """The scheduler's wait for grammars, the compiles under way, and the grammar CPU's charges."""

    state = RequestState.WAITING_FOR_GRAMMAR

    def __init__(self, backend: Backend, config: GrammarConfig, masks: GrammarMasks) -> None:
        self.config = config
        self.compiler = GrammarCompiler(backend, config)
        self.masks = masks
        self._waiting: dict[str, Request] = {}
        self._members: dict[str, list[Request]] = {}  # a waiting request's choices (n > 1), itself first
        self._refused: list[tuple[Request, InvalidRequestError]] = []
        self._carry: dict[str, float] = {}  # request -> service tokens owed below one whole token
        self._preprocess: dict[str, float] = {}  # request -> gateway CPU seconds, charged once it is live

    def hold(self, request: Request, members: Sequence[Request] = ()) -> bool:
        """True when `request` must wait for its grammar; a cached grammar is attached at once (False), a
        cached failure raises InvalidRequestError naming the grammar's field. `members`: the choices of
        n > 1 (the request first), each given a matcher of its own from the one compiled grammar."""
        grammar = request.sampling.grammar
        if grammar is None:
            return False
        choices = list(members) or [request]
        cached = self.compiler.cached(request)
        if cached is not None:
            if cached.matcher is None:
                raise InvalidRequestError(f"{grammar.field}: {cached.error}", grammar.field)
            for choice in choices:
                self.masks.attach(choice.request_id, cached.matcher.deep_copy(), 0.0)
            return False
        self._waiting[request.request_id] = request
        self._members[request.request_id] = choices
        self.compiler.request(request)
        return True

    @property
    def waiting(self) -> int:
        """Requests waiting for their grammar."""
        return len(self._waiting)

    def admit(self) -> list[Request]:
        """The waiting requests whose grammar is ready (their matchers attached), to be queued now."""
        if not self._waiting:
            return []
        ready, failed = self.compiler.poll()
        for request, reason in failed:
            if self._waiting.pop(request.request_id, None) is not None:
                self._members.pop(request.request_id, None)
                grammar = request.sampling.grammar
                field = grammar.field if grammar is not None else "grammar"
                self._refused.append((request, InvalidRequestError(f"{field}: {reason}", field)))
        admitted = []
        for request, matcher, cpu in ready:
            if self._waiting.pop(request.request_id, None) is not None:
                first, *others = self._members.pop(request.request_id, [request])
                for choice in others:  # each choice its own state; the compile is charged once, to the first
                    self.masks.attach(choice.request_id, matcher.deep_copy(), 0.0)
                self.masks.attach(first.request_id, matcher, cpu)
                admitted.append(request)
        return admitted

    def release(self, request_id: str) -> Request | None:
        """Take a waiting request out (it was aborted), or None if it is not waiting."""
        request = self._waiting.pop(request_id, None)
        if request is not None:
            self._members.pop(request_id, None)
            self.compiler.drop(request_id)
        return request

    def take_refused(self) -> list[tuple[Request, InvalidRequestError]]:
        """Requests refused since the last call because their grammar failed (once per request, whatever its
        n); the loop reports each."""
        refused, self._refused = self._refused, []
        return refused

    def note_preprocessing(self, request_id: str, cpu_s: float) -> None:
        """The gateway's CPU seconds for preparing `request_id`, charged with its grammar CPU once it is
        queued (a request still waiting for its adapter, grammar or KV is charged when it is queued)."""
        if cpu_s > 0 and math.isfinite(cpu_s):
            self._preprocess[request_id] = self._preprocess.get(request_id, 0.0) + cpu_s

    def charge(self, policy: SchedulingPolicy[Request], live: dict[str, Request]) -> None:
        """Charge each live request's grammar CPU since the last call to its fairness key (see the module)."""
        cpu = self.masks.take_cpu()
        queued = [r for r in self._preprocess if r in live and live[r].state not in HELD_STATES]
        for request_id in queued:  # (charged once queued: a held request's key may not be backlogged yet)
            cpu[request_id] = cpu.get(request_id, 0.0) + self._preprocess.pop(request_id)
        if not cpu:
            return
        rate = self.config.mask_us_per_token
        for request_id, seconds in cpu.items():
            request = live.get(request_id)
            if request is None or request.is_finished:
                self._carry.pop(request_id, None)
                continue
            owed = self._carry.get(request_id, 0.0) + seconds * 1e6 / rate
            whole = int(owed)
            self._carry[request_id] = owed - whole
            if whole:
                request.charged_service += policy.charge(request, whole, 0, 0)

    def forget(self, request_id: str) -> None:
        """A request ended: its matcher and carried fraction go."""
        self.masks.forget(request_id)
        self._carry.pop(request_id, None)
        self._preprocess.pop(request_id, None)

    def close(self) -> None:
        """Stop the compile threads and the mask thread."""
        self.compiler.close()
        self.masks.close()
