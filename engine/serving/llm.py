"""`LLM`: the offline batch API, `LLM(model).generate(prompts, params)`, in input order."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from engine.config import EngineConfig
from engine.core.request import FinishReason, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.token_logprobs import TokenLogprobs
from engine.serving.llm_engine import LLMEngine

Prompt = str | Sequence[int]


@dataclass
class CompletionOutput:
    """One finished generation."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None
    cached_tokens: int = 0
    preemptions: int = 0
    logprobs: list[TokenLogprobs] | None = None  # one per token, when SamplingParams.logprobs asked


class LLM:
    """Load a model once and generate for many prompts with continuous batching."""

    def __init__(self, model: str | None = None, **engine_config: Any) -> None:
        config = EngineConfig(model=model, **engine_config)  # fairness may be a FairnessConfig or a dict
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        metas: Sequence[RequestMeta] | None = None,
    ) -> list[CompletionOutput]:
        """Run every prompt to completion; outputs come back in input order."""
        single = isinstance(prompts, str) or (bool(prompts) and isinstance(prompts[0], int))
        # `single` told one prompt (a str or a list of ints) from a sequence of prompts, which mypy cannot see.
        plist = [cast(Prompt, prompts)] if single else list(cast(Sequence[Prompt], prompts))
        if params is None or isinstance(params, SamplingParams):
            params_list = [params or SamplingParams()] * len(plist)
        else:
            params_list = list(params)
        if any(p.n != 1 for p in params_list):  # outputs here are one text per prompt
            raise ValueError("LLM.generate serves one choice per prompt; use LLMEngine or the API for n > 1")
        if len(params_list) != len(plist):
            raise ValueError(f"got {len(plist)} prompts but {len(params_list)} sampling params")
        prompts_by_id: dict[str, list[int]] = {}
        for i, (prompt, p) in enumerate(zip(plist, params_list, strict=True)):
            request_id = f"llm-{next(self._ids)}"
            request = self.engine.add_request(request_id, prompt, p, metas[i] if metas else None)
            prompts_by_id[request_id] = request.prompt_token_ids
        # Deltas, summed here once per request: step() would copy every token so far, every iteration.
        tokens: dict[str, list[int]] = {i: [] for i in prompts_by_id}
        texts: dict[str, list[str]] = {i: [] for i in prompts_by_id}
        logprobs: dict[str, list[TokenLogprobs]] = {i: [] for i in prompts_by_id}
        done: dict[str, CompletionOutput] = {}
        while self.engine.has_unfinished():
            outputs = self.engine.step_deltas()
            for (
                _,
                refused,
            ) in self.engine.take_refused():  # a grammar that did not compile (engine/worker/grammar/)
                raise refused
            for out in outputs:
                tokens[out.request_id] += out.new_token_ids
                texts[out.request_id].append(out.delta_text)
                logprobs[out.request_id] += out.logprobs or []
                if out.finished:
                    done[out.request_id] = CompletionOutput(
                        out.request_id,
                        prompts_by_id[out.request_id],
                        tokens.pop(out.request_id),
                        "".join(texts.pop(out.request_id)),
                        out.finish_reason,
                        out.metrics.cached_tokens,
                        out.metrics.preemptions,
                        logprobs.pop(out.request_id) if out.logprobs is not None else None,
                    )
        return [done[i] for i in prompts_by_id]
