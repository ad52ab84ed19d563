"""The embedded byte-level tokenizer of the built-in model: 256 byte tokens and a few special tokens, no
merges, so it round-trips any UTF-8 text exactly; and GPT-2's byte map, which logprobs use to report a
byte-level token's bytes (engine/core/tokenizer.py `token_bytes`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import tokenizers

BYTE_SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>")

# The embedded byte tokenizer's own chat template (written into its tokenizer_config.json, so the default
# model chats): "<|role|>\ncontent\n" per message, then "<|assistant|>\n". With tools it lists them and asks
# for Qwen3's (Hermes) call format, writes an assistant's calls that way and a tool's result as Qwen3 does
# (a user turn in <tool_response>), so `make serve` shows tools end to end (gateway/openai/tools.py).
# Written without a newline after any tag: the environment trims those (trim_blocks).
BYTE_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\n# Tools\nYou may call these functions:\n"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    'Call one as <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}<|user|>\n<tool_response>\n{{ message['content'] }}\n</tool_response>\n"
    "{% else %}<|{{ message['role'] }}|>\n{{ message['content'] or '' }}"
    "{% for call in message.tool_calls or [] %}{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}"
    "}\n</tool_call>{% endfor %}{{ '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def write_byte_tokenizer(path: str | Path) -> None:
    """Write a byte-level BPE tokenizer.json (path: the file, or its directory): id b is byte b, then the specials."""
    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tk = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.add_special_tokens(
        [tokenizers.AddedToken(t, special=True, normalized=False) for t in BYTE_SPECIAL_TOKENS]
    )
    bos = 256  # "<|bos|>": the first special token
    tk.post_processor = tokenizers.processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", bos)]
    )
    target = Path(path)
    if target.suffix != ".json":  # a directory (created if needed) rather than the file itself
        target = target / "tokenizer.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    tk.save(str(target))


def byte_tokenizer_config() -> dict[str, Any]:
    """The tokenizer_config.json that goes with `write_byte_tokenizer`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|eos|>",
        "pad_token": "<|pad|>",
        "add_bos_token": True,
        "model_max_length": 2048,
        "chat_template": BYTE_CHAT_TEMPLATE,
    }


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte -> printable character map, the one the ByteLevel pre-tokenizer/decoder use.
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


@functools.cache
def unicode_to_bytes() -> dict[str, int]:
    return {ch: b for b, ch in _bytes_to_unicode().items()}
