"""Chat rendering with the model's own template: the real Qwen3 and Gemma 3 templates, rendered as transformers
renders them, from tokenizer_config.json or chat_template.jinja; a model without one is refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import transformers

from engine.core.byte_tokenizer import byte_tokenizer_config, write_byte_tokenizer
from engine.core.limits import RequestCaps
from engine.core.tokenizer import NoChatTemplateError, Tokenizer
from gateway.edge.errors import APIError
from gateway.openai.parsing import engine_input, parse_body

TEMPLATES = Path(__file__).parent / "chat_templates"
CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi <b>&'"}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3? "},
    ],
]


def _model_dir(root: Path, name: str, in_config: bool) -> Path:
    """A byte-tokenizer directory carrying the template as tokenizer_config.json's chat_template, or as
    chat_template.jinja beside it."""
    template = (TEMPLATES / f"{name}.jinja").read_text()
    write_byte_tokenizer(root)
    config = byte_tokenizer_config()
    del config["chat_template"]
    if in_config:
        config["chat_template"] = template
    else:
        (root / "chat_template.jinja").write_text(template)
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


@pytest.mark.parametrize(("name", "in_config"), [("qwen3", True), ("gemma3", False)])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
def test_renders_as_transformers_does(tmp_path: Path, name: str, in_config: bool, conversation: int) -> None:
    root = _model_dir(tmp_path, name, in_config)
    ours = Tokenizer.from_dir(root)
    theirs = transformers.AutoTokenizer.from_pretrained(str(root))
    messages = CONVERSATIONS[conversation]
    for generation_prompt in (True, False):
        expected = theirs.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        assert ours.apply_chat_template(messages, generation_prompt) == expected


def test_qwen3_and_gemma3_prompts_read_as_their_models_expect(tmp_path: Path) -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    qwen = Tokenizer.from_dir(_model_dir(tmp_path / "qwen3", "qwen3", in_config=True))
    assert qwen.apply_chat_template(chat) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    gemma = Tokenizer.from_dir(_model_dir(tmp_path / "gemma3", "gemma3", in_config=False))
    text = gemma.apply_chat_template(chat)
    assert text == "<|bos|><start_of_turn>user\nbe brief\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    ids = gemma.encode_chat(chat)
    assert ids.count(gemma.bos_token_id or -1) == 1  # the template wrote BOS: not added twice
    with pytest.raises(ValueError, match="roles must alternate"):
        gemma.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def _gateway_input(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    engine = SimpleNamespace(model_name="m", caps=RequestCaps(), tokenizer=tokenizer, max_model_len=4096)
    body = parse_body(json.dumps({"model": "m", "messages": messages}).encode(), chat=True, max_messages=2048)
    return list(engine_input(body, engine).prompt_token_ids)


def test_chat_completions_use_the_template_and_refuse_a_model_without_one(tmp_path: Path) -> None:
    qwen = Tokenizer.from_dir(_model_dir(tmp_path / "qwen3", "qwen3", in_config=True))
    messages = [{"role": "user", "content": "hi"}]
    assert _gateway_input(qwen, messages) == qwen.encode(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    write_byte_tokenizer(tmp_path / "bare")
    bare = Tokenizer.from_dir(tmp_path / "bare")
    with pytest.raises(NoChatTemplateError):
        bare.apply_chat_template(messages)
    with pytest.raises(APIError) as err:
        _gateway_input(bare, messages)
    assert err.value.status == 400 and err.value.param == "messages" and "no chat template" in str(err.value)


TOOLS: list[dict[Any, Any] | Callable[..., Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_LOOP: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
]


def test_qwen3_renders_tools_and_a_tool_loop_as_transformers_does(tmp_path: Path) -> None:
    root = _model_dir(tmp_path, "qwen3", in_config=True)
    ours = Tokenizer.from_dir(root)
    theirs = transformers.AutoTokenizer.from_pretrained(str(root))
    for messages in (TOOL_LOOP[:2], TOOL_LOOP):
        expected = theirs.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        text = ours.apply_chat_template(messages, tools=cast(list[dict[str, Any]], TOOLS))
        assert text == expected
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<tool_response>\n{"temp": 21}\n</tool_response>' in text


def test_a_template_without_tools_refuses_them(tmp_path: Path) -> None:
    root = _model_dir(tmp_path, "gemma3", in_config=False)
    with pytest.raises(ValueError, match="does not render tools"):
        Tokenizer.from_dir(root).apply_chat_template(TOOL_LOOP[1:2], tools=cast(list[dict[str, Any]], TOOLS))
