"""A large text prompt is tokenised on a worker thread, never on the gateway's event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from engine import AsyncEngine
from gateway.edge.errors import APIError
from gateway.openai import parsing as rp
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest


@pytest.mark.parametrize(("chars", "off_loop"), [(100, False), (rp.TOKENIZE_INLINE_CHARS + 1, True)])
def test_large_prompts_are_tokenised_off_the_loop(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, chars: int, off_loop: bool
) -> None:
    threads: list[int] = []
    real_encode, real_chat = engine.tokenizer.encode, engine.tokenizer.encode_chat

    def encode(*args: Any, **kw: Any) -> Any:
        threads.append(threading.get_ident())
        return real_encode(*args, **kw)

    def encode_chat(*args: Any, **kw: Any) -> Any:
        threads.append(threading.get_ident())
        return real_chat(*args, **kw)

    monkeypatch.setattr(engine.tokenizer, "encode", encode)
    monkeypatch.setattr(engine.tokenizer, "encode_chat", encode_chat)
    bodies: list[CompletionRequest | ChatCompletionRequest] = [
        CompletionRequest(model=engine.model_name, prompt="a" * chars, max_tokens=1),
        ChatCompletionRequest.model_validate(
            {
                "model": engine.model_name,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": "b" * chars}],
            }
        ),
    ]

    async def parse_all() -> int:
        for body in bodies:
            try:
                inputs, _ = await rp.engine_input_async(body, engine)
                assert len(inputs.prompt_token_ids) >= chars
            except APIError as exc:  # over this model's 2,048-token context: known only once tokenised
                assert exc.code == "context_length_exceeded" and chars > engine.max_model_len, exc
        return threading.get_ident()

    loop_thread = asyncio.run(parse_all())
    assert len(threads) >= 2  # encode_chat may call encode itself
    assert all((t != loop_thread) is off_loop for t in threads)
