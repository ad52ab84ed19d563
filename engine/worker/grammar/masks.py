"""GrammarMasks: each grammar request's token mask, computed on a thread of its own beside the forward pass.

    runner.run(batch):
        pending = masks.begin(batch.sampling)   the mask thread starts on this step's grammar rows
        hidden = model(...)                     the forward runs meanwhile (llguidance drops the GIL)
        masks.apply(pending, logits)            waits for the masks (done by then), disallowed -> -inf
        tokens = sampler.sample(logits, ...)
        masks.accept(batch.sampling, tokens)    each matcher consumes its token

The matchers consume every sampled token before the next step's `begin`, async scheduling included:
forwards run one after another on one thread, and a step's samples are taken at the end of its `run`.
Each mask's thread CPU time is kept per request, for the engine loop to charge as service (`take_cpu`).
A matcher that errs (a token it cannot take, a mask over its llguidance limits) fails its own request.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.core.errors import RequestFault
from engine.core.isolation import RequestFailures
from engine.core.request import Request
from engine.worker.grammar.closing import Closers, is_closing

if TYPE_CHECKING:
    import llguidance


class GrammarFailed(RequestFault):
    """A request's grammar matcher reached an error state (its mask or its token): the request's own fault,
    a 400 naming the field its grammar came from (`response_format` or `tools`)."""


@dataclass
class PendingMasks:
    """Masks being computed for one step: the grammar rows and the packed bitmask they fill."""

    rows: list[int]
    future: Future[tuple[np.ndarray, dict[str, tuple[str, str]]]]


_Row = tuple[
    int, str, "llguidance.LLMatcher", int | None, str
]  # batch row, request, matcher, lexer state if closing, the grammar's request field


_SHIFTS: dict[torch.device, torch.Tensor] = {}


class GrammarMasks:
    """The matchers of the grammar requests, and their masks step by step."""

    def __init__(
        self,
        vocab_size: int,
        failures: RequestFailures,
        closers: Callable[[], Closers] | None,
        context_len: int,
    ) -> None:
        self.vocab_size = vocab_size
        # Narrows the masks of outputs near their budget's end (closing.py); built at the first grammar
        # request (a pass over the vocabulary), so an engine that serves none never pays for it.
        self._make_closers = closers
        self._closers: Closers | None = None
        self.context_len = context_len  # the engine's max_model_len: a closing budget ends there too
        self.failures = failures  # the sampler's: the executors take them with the step's samples
        self._matchers: dict[str, llguidance.LLMatcher] = {}
        self._lock = threading.Lock()  # attach/forget on the loop thread, the rest on the forward thread
        self._cpu: dict[str, float] = {}  # request -> grammar CPU seconds not yet charged
        self._thread: ThreadPoolExecutor | None = None
        self.mask_seconds: deque[float] = deque(maxlen=10_000)  # CPU of recent masks, one per token

    def attach(self, request_id: str, matcher: llguidance.LLMatcher, compile_cpu_s: float) -> None:
        """A request's own matcher, before it is first scheduled; its compile CPU is charged with its masks."""
        with self._lock:
            self._matchers[request_id] = matcher
            if compile_cpu_s:
                self._cpu[request_id] = self._cpu.get(request_id, 0.0) + compile_cpu_s

    def forget(self, request_id: str) -> None:
        """A request ended: drop its matcher (a mask in flight keeps its own reference)."""
        with self._lock:
            self._matchers.pop(request_id, None)
        if self._closers is not None:
            self._closers.forget(request_id)

    def __bool__(self) -> bool:
        return bool(self._matchers)

    def begin(self, requests: list[Request]) -> PendingMasks | None:
        """Start computing the masks of this step's grammar rows; None when the step has none."""
        if not self._matchers:
            return None
        with self._lock:
            found = [(row, r.request_id, self._matchers.get(r.request_id)) for row, r in enumerate(requests)]
        rows: list[_Row] = [
            (row, rid, m, self._closing(requests[row]), _field(requests[row]))
            for row, rid, m in found
            if m is not None
        ]
        if not rows:
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, "fairserve-masks")
        future = self._thread.submit(self._compute, rows)
        return PendingMasks([row[0] for row in rows], future)

    def _closing(self, request: Request) -> int | None:
        """The lexer state of a request in its closing stretch (closing.py); None before it."""
        if self._make_closers is None or not is_closing(request, self.context_len):
            return None
        if self._closers is None:
            self._closers = self._make_closers()
        return self._closers.state(request)

    def _compute(self, rows: list[_Row]) -> tuple[np.ndarray, dict[str, tuple[str, str]]]:
        """On the mask thread: one packed mask per grammar row (32 tokens a word), timed per request, and
        the rows whose matcher erred (their mask allows everything: their request is failed anyway).

        Each row is written through llguidance's pointer call at an offset into one array: its numpy
        helper builds a ctypes view per row, which cost more than a small grammar's mask."""
        bitmask = np.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=np.int32)
        base, stride = bitmask.ctypes.data, bitmask.strides[0]
        spent: list[tuple[str, float]] = []
        errors: dict[str, tuple[str, str]] = {}
        clock = time.thread_time
        closers = self._closers
        for i, (_, request_id, matcher, closing, field) in enumerate(rows):
            t0 = clock()
            matcher.unsafe_compute_mask_ptr(base + i * stride, stride)
            if closing is not None and closers is not None:
                closers.narrow(bitmask[i], closing)
            spent.append((request_id, clock() - t0))
            if matcher.is_error():
                errors[request_id] = (matcher.get_error()[:200], field)
                bitmask[i] = -1
        with self._lock:
            for request_id, seconds in spent:
                self._cpu[request_id] = self._cpu.get(request_id, 0.0) + seconds
        self.mask_seconds.extend(s for _, s in spent)
        return bitmask, errors

    def apply(self, pending: PendingMasks, logits: torch.Tensor) -> None:
        """Wait for the step's masks and set every disallowed token's logit to -inf, in place."""
        bitmask, errors = pending.future.result()
        for request_id, (error, field) in errors.items():
            self.failures.run(request_id, partial(_fail, error, field), None)
        width = logits.shape[-1]
        allowed = _allowed(bitmask, width, logits.device)
        if pending.rows == list(range(len(logits))):  # every row has a grammar: in place, no gather
            logits.masked_fill_(~allowed, float("-inf"))
            return
        rows = torch.tensor(pending.rows, dtype=torch.long, device=logits.device)
        logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))

    def accept(self, requests: list[Request], tokens: list[int]) -> None:
        """Each grammar request's matcher consumes its sampled token; one that cannot fails its request."""
        if not self._matchers:
            return
        with self._lock:
            found = [
                (r.request_id, self._matchers.get(r.request_id), t, _field(r))
                for r, t in zip(requests, tokens, strict=True)
            ]
        for request_id, matcher, token, field in found:
            if matcher is not None:
                self.failures.run(request_id, partial(_consume, matcher, token, field), None)

    def take_cpu(self) -> dict[str, float]:
        """Grammar CPU seconds per request since the last call (the loop charges them as service)."""
        with self._lock:
            cpu, self._cpu = self._cpu, {}
        return cpu

    def close(self) -> None:
        """Stop the mask thread."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)


def _allowed(bitmask: np.ndarray, width: int, device: torch.device) -> torch.Tensor:
    """The packed masks as a [rows, width] bool tensor on `device` (columns past the tokenizer's vocabulary:
    never allowed). On the host numpy unpacks in one call; for a device the packed words travel (32 times
    fewer bytes) and are unpacked there."""
    rows = bitmask.shape[0]
    if device.type == "cpu":
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")[:, :width].astype(bool)
        allowed = torch.from_numpy(bits)
    else:
        shifts = _SHIFTS.get(device)
        if shifts is None:
            shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
        words = torch.from_numpy(bitmask).to(device, non_blocking=True)
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).bool().view(rows, -1)[:, :width]
    if allowed.shape[1] < width:
        pad = torch.zeros(rows, width - allowed.shape[1], dtype=torch.bool, device=device)
        allowed = torch.cat([allowed, pad], dim=1)
    return allowed


def _field(request: Request) -> str:
    """The request field its grammar came from (what a mask failure's 400 names)."""
    grammar = request.sampling.grammar
    return "response_format" if grammar is None else grammar.field


def _fail(error: str, field: str) -> None:
    raise GrammarFailed(f"the {field} grammar cannot be enforced: {error}", field)


def _consume(matcher: llguidance.LLMatcher, token: int, field: str) -> None:
    if matcher.is_stopped():  # ended (EOS taken): a sample after it is discarded by the scheduler anyway
        return
    if not matcher.consume_token(token):
        raise GrammarFailed(f"the {field} grammar refused token {token}: {matcher.get_error()[:200]}", field)
