"""Text <-> token ids: a `tokenizers.Tokenizer` plus the special ids and chat template of a model directory.

Also writes the embedded byte-level tokenizer (256 byte tokens + a few special tokens, no merges),
which round-trips any UTF-8 text exactly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import tokenizers
from jinja2 import Template, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

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

# Texts longer than this are encoded through `encode_batch`, which releases the GIL while the Rust tokenizer
# runs (`encode` holds it for the whole call: a 300 KB text held every other thread of the process, the
# gateway's event loop included, for half a second). Below it the batch call's overhead is not worth it.
ENCODE_RELEASING_GIL_CHARS = 4096

# Prompt tokens kept as left context when detokenizing, so tokenizers that drop a leading space
# at the start of a decode (SentencePiece "▁") still produce the right first output character.
_DETOK_CONTEXT = 5


class Tokenizer:
    """A model's tokenizer: encode/decode, special ids, chat template, incremental detokenizer."""

    def __init__(
        self,
        tk: tokenizers.Tokenizer,
        bos_token_id: int | None,
        eos_token_ids: list[int],
        chat_template: str | None,
        add_bos_token: bool | None = None,
    ) -> None:
        self._tk = tk
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template
        self._add_bos = add_bos_token
        self.vocab_size: int = tk.get_vocab_size(with_added_tokens=True)
        # The environment transformers renders chat templates in: loop controls, its tojson, strftime_now.
        self._template_env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        self._template_env.globals["raise_exception"] = _raise_template_error
        self._template_env.globals["strftime_now"] = _strftime_now
        self._template_env.filters["tojson"] = _tojson

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load <path>/tokenizer.json and the special ids / chat template from the JSON files beside it."""
        root = Path(path)
        tk_file = root / "tokenizer.json"
        if not tk_file.is_file():
            raise FileNotFoundError(f"{root}: no tokenizer.json (only fast tokenizers are supported)")
        tk = tokenizers.Tokenizer.from_file(str(tk_file))
        tk_cfg = read_json(root / "tokenizer_config.json")
        gen_cfg = read_json(root / "generation_config.json")
        model_cfg = read_json(root / "config.json")

        def token_id(entry: Any) -> int | None:
            text = entry.get("content") if isinstance(entry, dict) else entry
            return tk.token_to_id(text) if isinstance(text, str) else None

        bos = gen_cfg.get("bos_token_id", model_cfg.get("bos_token_id"))
        if bos is None:
            bos = token_id(tk_cfg.get("bos_token"))
        eos: list[int] = []
        for source in (
            gen_cfg.get("eos_token_id"),
            model_cfg.get("eos_token_id"),
            token_id(tk_cfg.get("eos_token")),
        ):
            eos = [source] if isinstance(source, int) else [int(x) for x in source or []]
            if eos:
                break
        template = tk_cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (root / "chat_template.jinja").is_file():
            template = (root / "chat_template.jinja").read_text()
        add_bos = tk_cfg.get("add_bos_token")
        return cls(tk, bos, eos, template, add_bos if isinstance(add_bos, bool) else None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of text; with add_special_tokens, the model's BOS (if it uses one) comes first."""
        if len(text) > ENCODE_RELEASING_GIL_CHARS:
            ids: list[int] = self._tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        else:
            ids = self._tk.encode(text, add_special_tokens=add_special_tokens).ids
        # Some tokenizer.json files lack the BOS post-processor that tokenizer_config.json asks for.
        if (
            add_special_tokens
            and self._add_bos
            and self.bos_token_id is not None
            and ids[:1] != [self.bos_token_id]
        ):
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ids; incomplete UTF-8 sequences become U+FFFD."""
        return str(self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text: what llguidance's tokenizer adapter reads (engine/grammar/)."""
        return str(self._tk.to_str())

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. a special token), or None."""
        result = self._tk.token_to_id(token)
        return None if result is None else int(result)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """Render messages (and `tools`, OpenAI's definitions) with the model's own chat template (sandboxed
        jinja2); NoChatTemplateError when the model ships none (a guessed format would prompt it in a way it
        was never trained on), ValueError when tools are given to a template that does not render them."""
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        special = {
            "bos_token": self._token_text(self.bos_token_id),
            "eos_token": self._token_text(self.eos_token_ids[0] if self.eos_token_ids else None),
        }
        if not self.chat_template:
            raise NoChatTemplateError(
                "this model has no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja): "
                "use /v1/completions, or add the model's template to its directory"
            )
        if tools and "tools" not in self.chat_template:
            raise ValueError("this model's chat template does not render tools")
        try:
            return self._compiled_template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **special
            )
        except TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from exc

    @functools.cached_property
    def _compiled_template(self) -> Template:
        """The chat template compiled once (compiling it costs more than rendering a short chat)."""
        return self._template_env.from_string(self.chat_template or "")

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Render and encode a chat, adding BOS only when the template did not already write it."""
        return self.encode_rendered_chat(self.apply_chat_template(messages, add_generation_prompt, tools))

    def encode_rendered_chat(self, text: str) -> list[int]:
        """Encode a chat `apply_chat_template` rendered, adding BOS only when the template did not write it
        (for a caller that measures the rendered text before paying for its encoding)."""
        bos_text = self._token_text(self.bos_token_id)
        return self.encode(text, add_special_tokens=not (bos_text and text.startswith(bos_text)))

    def detokenizer(self, prompt_ids: Sequence[int]) -> Detokenizer:
        """A fresh streaming detokenizer for one request's output.

        A prompt whose last ids are an incomplete character gets the window decoder: DecodeStream would
        complete (or replace) that character in the output, where the engine always left it to the prompt.
        """
        context = list(prompt_ids[-_DETOK_CONTEXT:])
        if context and self.decode(context).endswith("\ufffd"):
            return WindowDetokenizer(self, context)
        return IncrementalDetokenizer(self, context)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (logprobs report them, gateway/openai/logprobs.py): a byte-level
        vocabulary entry mapped back through GPT-2's byte map, a byte-fallback `<0xNN>` its byte, a
        SentencePiece `▁` a space, any other token (a special one) its text in UTF-8."""
        piece = self._tk.id_to_token(token_id)
        if piece is None:
            return b""
        inverse = _unicode_to_bytes()
        if self._byte_level and all(ch in inverse for ch in piece):
            return bytes(inverse[ch] for ch in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return bytes([int(piece[3:5], 16)])
            except ValueError:
                pass
        return piece.replace("\u2581", " ").encode("utf-8")

    @functools.cached_property
    def _byte_level(self) -> bool:
        """Whether the decoder is GPT-2's byte-level one (alone or in a sequence)."""
        decoder = json.loads(self._tk.to_str()).get("decoder") or {}
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(isinstance(p, dict) and p.get("type") == "ByteLevel" for p in parts)

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else str(self._tk.id_to_token(token_id) or "")

    @functools.cached_property
    def longest_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes of text one token can cover: a text of B bytes encodes to at
        least B / this many tokens, which proves some prompts too long without encoding them.

        The longest vocabulary entry in UTF-8 (byte-level and byte-fallback spellings only overstate the
        bytes they stand for), times 4 when a normalizer could shrink the text before it is split.
        """
        longest = max((len(t.encode("utf-8")) for t in self._tk.get_vocab(with_added_tokens=True)), default=1)
        return max(longest, 1) * (4 if self._tk.normalizer is not None else 1)


class IncrementalDetokenizer:
    """Turns a stream of output ids into text deltas whose concatenation equals the full decode.

    Text ending in U+FFFD (a multi-byte character split across tokens) is held back until the
    next token completes it; `finish()` releases whatever is still held.

    Each token goes through `tokenizers`' DecodeStream (one call into Rust: 0.9 us a token here, against
    1.7 us for the pair of window decodes per push of WindowDetokenizer), which holds back the same incomplete
    characters. DecodeStream has no end, though: a character still incomplete when the request ends
    would never come out. So the ids it holds are tracked here, and `finish()` decodes them after the
    ids of the last delta, as the window decode did, releasing U+FFFD like a full decode does.
    """

    __slots__ = ("_tk", "_stream", "_tail", "_pending", "_held")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> None:
        self._tk = tokenizer._tk
        context = list(prompt_ids[-_DETOK_CONTEXT:])
        self._stream = tokenizers.decoders.DecodeStream(ids=context, skip_special_tokens=True)
        self._tail = context  # the ids of the last text released: left context for finish()
        self._pending: list[int] = []  # ids the stream holds (no text yet)
        self._held = ""  # text the stream gave that waits for the pending ids (see push)

    def push(self, new_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (possibly empty)."""
        step, tk, pending = self._stream.step, self._tk, self._pending
        out = ""
        for token_id in new_ids:
            chunk = step(tk, token_id)
            if chunk is None:
                pending.append(token_id)
                continue
            if pending:
                pending.append(token_id)
                self._tail, self._pending = pending, []
                pending = self._pending
            else:
                self._tail = [token_id]
            out += chunk
        if (
            pending
            and (out or self._held)
            and tk.decode(pending, skip_special_tokens=True).endswith("\ufffd")
        ):
            # Several ids whose last ones are an incomplete character: the text of the whole push waits for
            # it, as it did when each push was decoded as one window (the deltas stay what they were).
            self._held += out
            return ""
        out, self._held = self._held + out, ""
        return out

    def finish(self) -> str:
        """Release held-back text at the end of the request (U+FFFD for a truly incomplete character)."""
        delta, self._held = self._held, ""
        if self._pending:
            before = self._tk.decode(self._tail, skip_special_tokens=True)
            after = self._tk.decode(self._tail + self._pending, skip_special_tokens=True)
            self._tail, self._pending = self._tail + self._pending, []
            delta += after[len(before) :] if len(after) > len(before) else ""
        return str(delta)


class WindowDetokenizer:
    """Incremental detokenization by decoding a window of ids twice per push (the engine's original method).

    Kept for prompts that end inside a character (see `Tokenizer.detokenizer`); same interface and
    behaviour as IncrementalDetokenizer otherwise, at four times its cost per token.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._ids = list(prompt_ids[-_DETOK_CONTEXT:])
        self._prefix_offset = 0  # start of the decode window (context tokens)
        self._read_offset = len(self._ids)  # tokens before this are already emitted

    def push(self, new_ids: Sequence[int]) -> str:
        """Append new output ids; return the text they complete (possibly empty)."""
        self._ids.extend(new_ids)
        return self._emit(hold_incomplete=True)

    def finish(self) -> str:
        """Release held-back text at the end of the request (U+FFFD for a truly incomplete character)."""
        return self._emit(hold_incomplete=False)

    def _emit(self, hold_incomplete: bool) -> str:
        decode = self._tokenizer.decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or (hold_incomplete and new_text.endswith("\ufffd")):
            return ""
        delta = new_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return delta


Detokenizer = IncrementalDetokenizer | WindowDetokenizer


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
def _unicode_to_bytes() -> dict[str, int]:
    return {ch: b for b, ch in _bytes_to_unicode().items()}


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; {} when the file is absent, ValueError naming the file when it is malformed."""
    if not path.is_file():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    return loaded if isinstance(loaded, dict) else {}


class NoChatTemplateError(ValueError):
    """The model directory has no chat template, so a chat cannot be rendered as the model expects."""


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
