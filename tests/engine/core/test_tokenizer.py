"""Byte tokenizer round trips, incremental detokenization and chat templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from engine.core.byte_tokenizer import BYTE_SPECIAL_TOKENS, byte_tokenizer_config, write_byte_tokenizer
from engine.core.tokenizer import NoChatTemplateError, Tokenizer


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("byte_tok")
    write_byte_tokenizer(root)
    (root / "tokenizer_config.json").write_text(json.dumps(byte_tokenizer_config()))
    return root


@pytest.fixture(scope="module")
def tok(byte_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(byte_dir)


def test_special_ids_come_from_the_directory(tok: Tokenizer) -> None:
    assert tok.vocab_size == 256 + len(BYTE_SPECIAL_TOKENS)
    assert tok.bos_token_id == tok.token_to_id("<|bos|>")
    assert tok.eos_token_ids == [tok.token_to_id("<|eos|>")]


def test_generation_config_eos_list_wins(tmp_path: Path) -> None:
    write_byte_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(byte_tokenizer_config()))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [258, 7]}))
    assert Tokenizer.from_dir(tmp_path).eos_token_ids == [258, 7]


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_byte_tokenizer_round_trips_any_unicode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id
    # Exact for every text once special tokens are shown (a literal "<|eos|>" in text is the special token).
    assert tok.decode(ids[1:], skip_special_tokens=False) == text
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
    if not any(special in text for special in BYTE_SPECIAL_TOKENS):
        assert ids[1:] == list(text.encode("utf-8"))  # one token per UTF-8 byte, id = byte value
        assert tok.decode(ids) == text


def test_special_tokens_show_only_when_asked(tok: Tokenizer) -> None:
    ids = tok.encode("hi", add_special_tokens=True) + tok.eos_token_ids
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|bos|>hi<|eos|>"


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.integers(min_value=0, max_value=256 + len(BYTE_SPECIAL_TOKENS) - 1), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_incremental_detokenizer_equals_full_decode_for_any_split(
    tok: Tokenizer, ids: list[int], cuts: list[int]
) -> None:
    # Arbitrary ids include invalid and truncated UTF-8 as well as special tokens.
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    detok = tok.detokenizer(tok.encode("prompt: "))
    deltas = [detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    assert "".join(deltas) + detok.finish() == tok.decode(ids)


@settings(max_examples=100, deadline=None)
@given(text=st.text(min_size=1), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=10))
def test_incremental_detokenizer_never_emits_half_characters(
    tok: Tokenizer, text: str, cuts: list[int]
) -> None:
    assume(not any(special in text for special in BYTE_SPECIAL_TOKENS))
    ids = tok.encode(text, add_special_tokens=False)
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    detok = tok.detokenizer(tok.encode("ctx"))
    deltas = [detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
    if "\ufffd" not in text:
        assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text  # valid text is complete without finish()
    assert detok.finish() == ""


class _WindowDetokenizer:
    """The window-decode detokenizer the engine used before DecodeStream, kept as the behaviour to match."""

    def __init__(self, tok: Tokenizer, prompt_ids: list[int]) -> None:
        self._tok = tok
        self._ids = list(prompt_ids[-5:])
        self._prefix, self._read = 0, len(self._ids)

    def push(self, new_ids: list[int]) -> str:
        self._ids.extend(new_ids)
        return self._emit(hold=True)

    def finish(self) -> str:
        return self._emit(hold=False)

    def _emit(self, hold: bool) -> str:
        before = self._tok.decode(self._ids[self._prefix : self._read])
        after = self._tok.decode(self._ids[self._prefix :])
        if len(after) <= len(before) or (hold and after.endswith("\ufffd")):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before) :]


@settings(max_examples=300, deadline=None)
@given(
    prompt=st.lists(st.integers(min_value=0, max_value=256 + len(BYTE_SPECIAL_TOKENS) - 1), max_size=8),
    ids=st.lists(st.integers(min_value=0, max_value=256 + len(BYTE_SPECIAL_TOKENS) - 1), max_size=40),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_decode_stream_detokenizer_gives_the_window_decoders_deltas(
    tok: Tokenizer, prompt: list[int], ids: list[int], cuts: list[int]
) -> None:
    """Delta for delta, not only in total: streams, stop strings and usage see exactly what they saw before."""
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    new, old = tok.detokenizer(prompt), _WindowDetokenizer(tok, prompt)
    for a, b in zip(bounds, bounds[1:], strict=False):
        assert new.push(ids[a:b]) == old.push(ids[a:b])
    assert new.finish() == old.finish()


def test_detokenizer_uses_prompt_context_for_leading_spaces(tmp_path: Path) -> None:
    # SentencePiece-style decoders drop the space of a word that starts a decode.
    tk = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"<unk>": 0, "▁hello": 1, "▁world": 2}, unk_token="<unk>")
    )
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    tk.decoder = tokenizers.decoders.Metaspace()
    tk.save(str(tmp_path / "tokenizer.json"))
    tok = Tokenizer.from_dir(tmp_path)
    prompt = tok.encode("hello")
    assert tok.decode(tok.encode("world")) == "world"
    assert tok.detokenizer(prompt).push(tok.encode("world")) == " world"


def test_a_model_without_a_chat_template_is_refused_not_guessed(tmp_path: Path) -> None:
    write_byte_tokenizer(tmp_path)  # no tokenizer_config.json: no template
    tok = Tokenizer.from_dir(tmp_path)
    assert tok.chat_template is None
    with pytest.raises(NoChatTemplateError, match="no chat template.*/v1/completions"):
        tok.encode_chat([{"role": "user", "content": "hi"}])


def test_byte_tokenizer_chat_template_uses_role_tokens(tok: Tokenizer) -> None:
    assert tok.chat_template is not None
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[:2] == [tok.bos_token_id, tok.token_to_id("<|user|>")]
    assert ids[-2:] == [tok.token_to_id("<|assistant|>"), ord("\n")]


def _with_template(root: Path, template: str) -> Tokenizer:
    write_byte_tokenizer(root)
    (root / "tokenizer_config.json").write_text(
        json.dumps({**byte_tokenizer_config(), "chat_template": template})
    )
    return Tokenizer.from_dir(root)


def test_model_chat_template_with_bos_is_not_doubled(tmp_path: Path) -> None:
    tok = _with_template(
        tmp_path,
        "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}"
        "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}",
    )
    text = tok.apply_chat_template([{"role": "user", "content": "x"}])
    assert text == "<|bos|>[user]x<|eos|>[assistant]"
    ids = tok.encode_chat([{"role": "user", "content": "x"}])
    assert tok.bos_token_id is not None
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id


def test_chat_template_errors_are_value_errors(tmp_path: Path) -> None:
    tok = _with_template(
        tmp_path,
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}",
    )
    with pytest.raises(ValueError, match="first must be user"):
        tok.apply_chat_template([{"role": "assistant", "content": "x"}])
    escape = _with_template(tmp_path / "sandbox", "{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ValueError, match="chat template failed"):
        escape.apply_chat_template([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        tok.apply_chat_template([{"content": "no role"}])


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_token_bytes_are_the_bytes_a_token_stands_for(tok: Tokenizer, tmp_path: Path) -> None:
    """What logprobs report as `bytes`: the byte-level map undone, a byte-fallback byte, a `▁` space."""
    assert [tok.token_bytes(b) for b in range(256)] == [bytes([b]) for b in range(256)]
    eos = tok.eos_token_ids[0]
    assert tok.token_bytes(eos) == tok.decode([eos], skip_special_tokens=False).encode()
    tk = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"<unk>": 0, "▁hi": 1, "<0x0A>": 2}, unk_token="<unk>")
    )
    tk.decoder = tokenizers.decoders.Metaspace()
    tk.save(str(tmp_path / "tokenizer.json"))
    piece = Tokenizer.from_dir(tmp_path)
    assert [piece.token_bytes(i) for i in (1, 2)] == [b" hi", b"\n"]
