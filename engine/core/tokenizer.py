"""Text <-> token ids: a `tokenizers.Tokenizer` plus the special ids and chat template of a model directory.

Streaming detokenizers are in engine/core/detokenizer.py; the embedded byte-level tokenizer the built-in model
uses is written by engine/core/byte_tokenizer.py.
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

from engine.core.byte_tokenizer import unicode_to_bytes
from engine.core.detokenizer import DETOK_CONTEXT, Detokenizer, IncrementalDetokenizer, WindowDetokenizer

# Texts longer than this are encoded through `encode_batch`, which releases the GIL while the Rust tokenizer
# runs (`encode` holds it for the whole call: a 300 KB text held every other thread of the process, the
# gateway's event loop included, for half a second). Below it the batch call's overhead is not worth it.
ENCODE_RELEASING_GIL_CHARS = 4096


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
        """The tokenizer as tokenizer.json text: what llguidance's tokenizer adapter reads (engine/worker/grammar/)."""
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
        context = list(prompt_ids[-DETOK_CONTEXT:])
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
        inverse = unicode_to_bytes()
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
