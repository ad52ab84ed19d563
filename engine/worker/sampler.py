"""Token selection for a whole batch on the logits' device, with one copy of the results to the host.

Greedy, temperature, top-k, top-p, min-p, logit bias, the presence, frequency and repetition penalties and
per-request seeds run as batched tensor operations
(engine/worker/sampling_math.py) on the device the logits are on, so on a GPU sampling queues behind the forward
pass and the host waits once per step: for the single device-to-host copy of the new token ids. When
some row asks for `logprobs`, the ids, the sampled tokens' logprobs and the top alternatives are packed
into that same copy (one float64 tensor: ids up to 2**53 are exact in it), so it stays one copy.
Stop tokens (EOS, stop_token_ids) are checked by the host on the copied ids (Request.stop_reason).

The penalties count each request's tokens so far: its prompt (kept on the device once, at its first step)
and the tokens this sampler gave it, recorded here from the step's copy rather than read from the request,
whose last id is a placeholder while async scheduling has its token in flight (engine/core/async_scheduler.py).

A seeded request draws its noise from its own torch.Generator on the logits' device, one row of Exp(1)
per sample, so its samples do not depend on what else shares the batch (or on its row); every other
row's noise is one shared draw. Each row is one request's work: its parameters are read on the host
row by row (`_plan_row`), and a row whose reading raises is recorded in `failures` (engine/core/isolation.py)
and gets a placeholder token, so the engine ends that request alone (a parameter out of range, should
validation ever let one through, is a RequestFault naming it: a 400, not a 500). Should the batched computation
itself raise (nothing a request's validated input can cause), each row is retried alone, so a fault still
fails only the rows it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch

from engine.core.errors import RequestFault
from engine.core.isolation import RequestFailures
from engine.core.request import Request
from engine.core.token_logprobs import TokenLogprobs
from engine.worker import sampling_math
from engine.worker.sampling_math import Distribution, Nucleus

FAILED_TOKEN = 0  # placeholder for a row whose sampling raised; its request is ended with an error


@dataclass(slots=True)
class _Row:
    """One request's sampling parameters for this step, read on the host."""

    request_id: str
    greedy: bool
    temperature: float  # 1 for a greedy row: its logprobs are of the (biased, truncated) model distribution
    top_k: int  # 0: no limit (a k at or over the vocabulary is none either)
    top_p: float
    generator: torch.Generator | None  # a seeded request's own; None draws from the shared one
    bias: tuple[torch.Tensor, torch.Tensor] | None  # (token ids, values) on the logits' device
    logprobs: int | None  # how many top alternatives to report; None: no logprobs
    min_p: float = 0.0
    # (presence, frequency, repetition), the prompt's ids on the device and the output so far; None: none
    penalty: tuple[float, float, float] | None = None
    prompt: torch.Tensor | None = None
    output: list[int] | None = None

    @property
    def processed(self) -> bool:
        """Whether the row needs its distribution, not only the argmax."""
        return not self.greedy or self.logprobs is not None


class Sampler:
    """Samples one token per row of logits."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}  # the unseeded rows' generator, per device
        self._per_request: dict[str, torch.Generator] = {}
        self._bias: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # request -> (ids, biases), built once
        # A penalized request's prompt ids on the device (built once) and the tokens sampled for it so far.
        self._prompts: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, list[int]] = {}
        self.failures = RequestFailures()
        # The ids of the last `sample` where the logits were (async scheduling feeds the next forward from them).
        self.last_sampled: torch.Tensor | None = None
        # The last `sample`'s logprobs, by request id, for the requests that asked for them.
        self.last_logprobs: dict[str, TokenLogprobs] = {}

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator and bias."""
        self._per_request.pop(request_id, None)
        self._bias.pop(request_id, None)
        self._prompts.pop(request_id, None)
        self._outputs.pop(request_id, None)

    def sample(self, logits: torch.Tensor, requests: Sequence[Request]) -> list[int]:
        """logits: [len(requests), vocab] on any device; returns one token id per request."""
        self.last_logprobs = {}
        if all(
            r.sampling.greedy
            and not r.sampling.logit_bias
            and r.sampling.logprobs is None
            and not r.sampling.penalized
            for r in requests
        ):
            argmax = logits.argmax(dim=-1)
            self.last_sampled = argmax
            return argmax.tolist()  # the step's one copy to the host
        device, vocab = logits.device, logits.shape[-1]
        plans = [
            self.failures.run(r.request_id, partial(self._plan_row, r, vocab, device), None) for r in requests
        ]
        live = [i for i, plan in enumerate(plans) if plan is not None]
        tokens = [FAILED_TOKEN] * len(requests)
        on_device: torch.Tensor | None = None
        try:
            on_device = self._sample_rows(logits, plans, live, tokens)
        except Exception:
            for i in live:  # one row at a time: the fault fails only the rows it belongs to
                self.failures.run(
                    requests[i].request_id, partial(self._sample_rows, logits, plans, [i], tokens), None
                )
        if on_device is None or len(live) != len(requests):
            on_device = torch.tensor(tokens, dtype=torch.int64).to(device)  # only after a failure
        self.last_sampled = on_device
        if self._outputs:
            for request, token in zip(requests, tokens, strict=True):
                output = self._outputs.get(request.request_id)
                if output is not None:
                    output.append(token)
        return tokens

    def _plan_row(self, request: Request, vocab: int, device: torch.device) -> _Row:
        """Read a request's parameters on the host; what raises here is that request's alone."""
        params = request.sampling
        bias = self._bias.get(request.request_id)
        if bias is None and params.logit_bias:
            ids = torch.tensor(list(params.logit_bias.keys()), dtype=torch.int64)
            if int(ids.min()) < 0 or int(ids.max()) >= vocab:
                raise RequestFault(f"logit_bias token id outside the vocabulary [0, {vocab})", "logit_bias")
            values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)
            bias = self._bias[request.request_id] = (ids.to(device), values.to(device))
        if params.logprobs is not None and not 0 <= params.logprobs <= vocab:
            raise RequestFault(f"logprobs {params.logprobs} outside [0, {vocab}]", "logprobs")
        greedy = params.greedy
        generator = None
        if params.seed is not None and not greedy:
            generator = self._per_request.get(request.request_id)
            if generator is None:
                generator = torch.Generator(device=device).manual_seed(params.seed)
                self._per_request[request.request_id] = generator
        top_k = params.top_k if params.top_k < vocab else 0
        temperature = 1.0 if greedy else params.temperature
        row = _Row(
            request.request_id, greedy, temperature, top_k, params.top_p, generator, bias, params.logprobs
        )
        row.min_p = params.min_p
        if params.penalized:
            row.penalty = (params.presence_penalty, params.frequency_penalty, params.repetition_penalty)
            row.prompt, row.output = self._history(request, vocab, device)
        return row

    def _history(self, request: Request, vocab: int, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """A penalized request's prompt ids on the device and its output so far, built at its first step (its
        output then is what it already holds, a handed-off or restored request's included)."""
        rid = request.request_id
        prompt, output = self._prompts.get(rid), self._outputs.get(rid)
        if prompt is None or output is None:
            ids = request.prompt_token_ids
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                raise ValueError(f"prompt token id outside the vocabulary [0, {vocab})")
            prompt = self._prompts[rid] = to_device(ids, torch.int64, device)
            output = self._outputs[rid] = [t for t in request.output_token_ids if 0 <= t < vocab]
        return prompt, output

    def _sample_rows(
        self, logits: torch.Tensor, plans: Sequence[_Row | None], rows: list[int], tokens: list[int]
    ) -> torch.Tensor:
        """Sample `rows` of the batch into `tokens` (and their logprobs into `last_logprobs`); returns
        their ids on the device."""
        row_plans = [p for p in (plans[i] for i in rows) if p is not None]
        device = logits.device
        scores = logits if len(rows) == len(plans) else logits.index_select(0, _rows(rows, device))
        scores = scores.float()
        if any(p.bias is not None for p in row_plans):
            scores = scores.clone() if scores is logits else scores
            for j, plan in enumerate(row_plans):
                if plan.bias is not None:
                    scores[j].index_add_(0, *plan.bias)
        if any(p.penalty is not None for p in row_plans):
            scores = self._penalize(scores, row_plans)
        chosen = scores.argmax(dim=-1)  # the greedy rows' tokens
        processed_rows = [j for j, p in enumerate(row_plans) if p.processed]
        if not processed_rows:
            ids = chosen.tolist()  # the step's one copy to the host
        else:
            processed_plans = [row_plans[j] for j in processed_rows]
            dist = self._process(scores, processed_rows, processed_plans, len(row_plans))
            picked = self._draw(dist, processed_plans, scores.shape[-1])
            if len(processed_rows) == len(row_plans):
                chosen = picked
            else:
                chosen = chosen.index_copy(0, _rows(processed_rows, device), picked)
            logprob_rows = [k for k, p in enumerate(processed_plans) if p.logprobs is not None]
            if logprob_rows:
                ids = self._copy_with_logprobs(chosen, dist, picked, processed_plans)
            else:
                ids = chosen.tolist()  # the step's one copy to the host
        for i, token in zip(rows, ids, strict=True):
            tokens[i] = token
        return chosen

    def _penalize(self, scores: torch.Tensor, plans: list[_Row]) -> torch.Tensor:
        """`scores` with each penalized row's penalties applied (engine/worker/sampling_math.py, `penalize`): the
        rows' prompts padded on the device, their outputs padded in one copy, one batched computation."""
        device, vocab = scores.device, scores.shape[-1]
        rows = [j for j, p in enumerate(plans) if p.penalty is not None]
        chosen = [plans[j] for j in rows]
        prompts = torch.nn.utils.rnn.pad_sequence(
            [p.prompt for p in chosen if p.prompt is not None], batch_first=True, padding_value=vocab
        )
        outputs = [p.output or [] for p in chosen]
        width = max(len(o) for o in outputs)
        padded = to_device([o + [vocab] * (width - len(o)) for o in outputs], torch.int64, device)
        settings = to_device([list(p.penalty or (0.0, 0.0, 1.0)) for p in chosen], torch.float32, device)
        index = None if len(rows) == len(plans) else _rows(rows, device)
        subset = scores if index is None else scores.index_select(0, index)
        penalized = sampling_math.penalize(
            subset, prompts, padded.view(len(rows), width), settings[:, 0], settings[:, 1], settings[:, 2]
        )
        return penalized if index is None else scores.index_copy(0, index, penalized)

    def _process(
        self, scores: torch.Tensor, processed_rows: list[int], plans: list[_Row], rows: int
    ) -> Distribution:
        """The distributions of `processed_rows`: temperature, min-p, top-k, top-p (engine/worker/sampling_math.py)."""
        device = scores.device
        subset = (
            scores if len(processed_rows) == rows else scores.index_select(0, _rows(processed_rows, device))
        )
        settings = to_device(  # one copy for the four; a k is exact in float32 (vocabularies < 2**24)
            [
                [p.temperature for p in plans],
                [p.top_k for p in plans],
                [p.top_p for p in plans],
                [p.min_p for p in plans],
            ],
            torch.float32,
            device,
        )
        widest_k = max(p.top_k for p in plans)
        width = max(p.logprobs or 0 for p in plans)
        nucleus = Nucleus.NONE if all(p.top_p >= 1.0 for p in plans) else Nucleus.FULL
        if all(p.top_k for p in plans) and width <= widest_k:
            nucleus = Nucleus.CANDIDATES  # every row has a top-k: work on the candidates only
        min_p = settings[3] if any(p.min_p > 0 for p in plans) else None
        return sampling_math.process(
            subset, settings[0], settings[1].long(), settings[2], widest_k, nucleus, min_p
        )

    def _draw(self, dist: Distribution, plans: list[_Row], vocab: int) -> torch.Tensor:
        """Each row's token: a greedy row's most likely, every other row's drawn from its distribution."""
        picked = dist.tokens(dist.scores.argmax(dim=-1))
        drawn = [k for k, p in enumerate(plans) if not p.greedy]
        if not drawn:
            return picked
        device = dist.scores.device
        index = None if len(drawn) == len(plans) else _rows(drawn, device)
        sub = dist if index is None else dist.rows(index)
        noise = torch.empty_like(sub.scores)
        seeded = [(n, g) for n, g in enumerate(plans[k].generator for k in drawn) if g is not None]
        if not seeded:
            noise.uniform_(generator=self._shared_generator(device))
        else:
            shared = [n for n, k in enumerate(drawn) if plans[k].generator is None]
            if shared:
                rows = torch.empty((len(shared), noise.shape[1]), device=device)
                noise.index_copy_(
                    0, _rows(shared, device), rows.uniform_(generator=self._shared_generator(device))
                )
            for n, generator in seeded:
                # A seeded row's own stream, one draw per vocabulary token whatever the batch's form (its
                # candidates read theirs by token id), so its tokens do not depend on what shares the batch.
                if sub.ids is None:
                    noise[n].uniform_(generator=generator)
                else:
                    full = torch.empty(vocab, device=device).uniform_(generator=generator)
                    noise[n] = full.index_select(0, sub.ids[n])
        tokens = sampling_math.race(sub, sampling_math.exponential_noise(noise))
        return tokens if index is None else picked.index_copy(0, index, tokens)

    def _copy_with_logprobs(
        self,
        chosen: torch.Tensor,
        dist: Distribution,
        picked: torch.Tensor,
        plans: list[_Row],
    ) -> list[int]:
        """The tokens, with the logprob rows' values packed into the same copy; fills `last_logprobs`."""
        device = chosen.device
        wanted = [k for k, p in enumerate(plans) if p.logprobs is not None]
        if len(wanted) != len(plans):
            index = _rows(wanted, device)
            dist = dist.rows(index)
            picked = picked.index_select(0, index)
        width = max(plans[k].logprobs or 0 for k in wanted)
        own, values, ids = sampling_math.top_logprobs(dist, picked, width)
        packed = torch.cat(
            [chosen.double(), own.double(), values.double().flatten(), ids.double().flatten()]
        ).tolist()  # the step's one copy to the host
        n, m = len(chosen), len(wanted)
        for r, k in enumerate(wanted):
            count = plans[k].logprobs or 0
            start = n + m + r * width
            top_values = packed[start : start + count]
            top_ids = [int(t) for t in packed[start + m * width : start + m * width + count]]
            self.last_logprobs[plans[k].request_id] = TokenLogprobs(packed[n + r], top_ids, top_values)
        return [int(t) for t in packed[:n]]

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        generator = self._shared.get(device)
        if generator is None:
            generator = self._shared[device] = torch.Generator(device=device).manual_seed(self._seed)
        return generator


def to_device(values: Sequence[object], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list as a tensor on `device`, copied without waiting for the device: a plain copy to a
    GPU waits for everything queued before it (the forward pass), a pinned non-blocking one does not."""
    host = torch.tensor(values, dtype=dtype)
    return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)


def _rows(rows: list[int], device: torch.device) -> torch.Tensor:
    return to_device(rows, torch.int64, device)
