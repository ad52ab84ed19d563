"""Truncating a chat to fit a deadline: the system (and developer) messages stay, whole turns go oldest first,
the last turn always stays; when even that does not fit there is nothing to serve."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.core.tokenizer import Tokenizer
from gateway.openai.degrade import _chat_kept
from gateway.openai.schemas import ChatCompletionRequest
from tests.gateway.two_models import build_model

SYSTEM = {"role": "system", "content": "You are terse. " * 5}
TURNS = [
    {"role": "user", "content": "first question " * 10},
    {"role": "assistant", "content": "first answer " * 10},
    {"role": "user", "content": "second question " * 10},
    {"role": "assistant", "content": "second answer " * 10},
    {"role": "user", "content": "the latest question"},
]


def test_a_chat_keeps_its_system_message_and_latest_turns(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_dir(build_model(tmp_path, "fast"))
    engine: Any = SimpleNamespace(tokenizer=tokenizer)
    body = ChatCompletionRequest.model_validate({"model": "fast", "messages": [SYSTEM, *TURNS]})

    def length(messages: list[dict[str, str]]) -> int:
        return len(tokenizer.encode_chat(messages))

    whole = length([SYSTEM, *TURNS])
    assert _chat_kept(body, engine, whole) == tokenizer.encode_chat([SYSTEM, *TURNS])  # fits: nothing dropped
    # One token short of the whole chat: the oldest turn goes, whole, and the system message stays.
    assert _chat_kept(body, engine, whole - 1) == tokenizer.encode_chat([SYSTEM, *TURNS[1:]])
    # Room for the system message and the last two turns only.
    two = length([SYSTEM, *TURNS[-2:]])
    assert _chat_kept(body, engine, two) == tokenizer.encode_chat([SYSTEM, *TURNS[-2:]])
    # The system message and the last turn are the least it serves.
    assert _chat_kept(body, engine, length([SYSTEM, TURNS[-1]]) - 1) is None
