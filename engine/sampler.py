"""Token selection: logit bias, greedy, temperature, top-k, top-p, with per-request seeded generators.

A seeded request draws from its own torch.Generator, so its samples do not depend on what else
shares the batch. Each row is one request's work: a row that raises is recorded in `failures`
(engine/isolation.py) and gets a placeholder token, and the engine ends that request alone.
"""

from __future__ import annotations

from functools import partial

import torch

from engine.isolation import RequestFailures
from engine.request import Request

FAILED_TOKEN = 0  # placeholder for a row whose sampling raised; its request is ended with an error


class Sampler:
    """Samples one token per row of logits."""

    def __init__(self, seed: int) -> None:
        self._global = torch.Generator().manual_seed(seed)
        self._per_request: dict[str, torch.Generator] = {}
        self._bias: dict[
            str, tuple[torch.Tensor, torch.Tensor]
        ] = {}  # request -> (token ids, biases), built once
        self.failures = RequestFailures()
        # The ids of the last `sample` where the logits were (async scheduling feeds the next forward from them).
        self.last_sampled: torch.Tensor | None = None

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._per_request.pop(request_id, None)
        self._bias.pop(request_id, None)

    def _generator(self, request: Request) -> torch.Generator:
        seed = request.sampling.seed
        if seed is None:
            return self._global
        gen = self._per_request.get(request.request_id)
        if gen is None:
            gen = torch.Generator().manual_seed(seed)
            self._per_request[request.request_id] = gen
        return gen

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """logits: [len(requests), vocab] float32 on any device; returns one token id per request."""
        plain = all(r.sampling.greedy and not r.sampling.logit_bias for r in requests)
        on_device = logits.argmax(dim=-1)
        tokens = on_device.cpu()
        if plain:
            self.last_sampled = on_device
            return tokens.tolist()
        logits = logits.float().cpu()
        out = [int(t) for t in tokens.tolist()]
        for row, request in enumerate(requests):
            params = request.sampling
            if params.greedy and not params.logit_bias:
                continue
            out[row] = self.failures.run(
                request.request_id, partial(self._sample_row, logits[row], request), FAILED_TOKEN
            )
        self.last_sampled = torch.tensor(out, dtype=torch.int64, device=on_device.device)
        return out

    def _sample_row(self, scores: torch.Tensor, request: Request) -> int:
        params = request.sampling
        if params.logit_bias:
            bias = self._bias.get(request.request_id)
            if bias is None:
                bias = self._bias[request.request_id] = (
                    torch.tensor(list(params.logit_bias.keys()), dtype=torch.long),
                    torch.tensor(list(params.logit_bias.values()), dtype=scores.dtype),
                )
            scores = scores.index_add(0, bias[0], bias[1])
        if params.greedy:
            return int(scores.argmax())
        # Shift so the largest score is 0 before dividing: a tiny temperature then yields very negative
        # numbers (exp -> 0), never +inf (softmax -> nan), so every validated temperature samples.
        scores = (scores - scores.max()) / params.temperature
        if 0 < params.top_k < scores.numel():
            kth = torch.topk(scores, params.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = sorted_probs.cumsum(0) - sorted_probs > params.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self._generator(request))[0])
