"""Token selection: greedy, temperature, top-k, top-p, with per-request seeded generators.

A seeded request draws from its own torch.Generator, so its samples do not depend on what else
shares the batch.
"""

from __future__ import annotations

import torch

from engine.request import Request


class Sampler:
    """Samples one token per row of logits."""

    def __init__(self, seed: int = 0) -> None:
        self._global = torch.Generator().manual_seed(seed)
        self._per_request: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        """Drop a finished request's generator."""
        self._per_request.pop(request_id, None)

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
        tokens = logits.argmax(dim=-1).cpu()
        if all(r.sampling.greedy for r in requests):
            return tokens.tolist()  # type: ignore[no-any-return]
        logits = logits.float().cpu()
        for row, request in enumerate(requests):
            params = request.sampling
            if params.greedy:
                continue
            scores = logits[row] / params.temperature
            if params.top_k > 0 and params.top_k < scores.numel():
                kth = torch.topk(scores, params.top_k).values[-1]
                scores = scores.masked_fill(scores < kth, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            if params.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
                drop = sorted_probs.cumsum(0) - sorted_probs > params.top_p
                sorted_probs = sorted_probs.masked_fill(drop, 0.0)
                probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
            tokens[row] = torch.multinomial(probs, 1, generator=self._generator(request))[0]
        return [int(t) for t in tokens.tolist()]
