"""Counting a large body's messages, text parts and other entries before validating it, so that a cap
refuses them cheaply.

pydantic validates every item of a list before a `max_length` can refuse it, and holds the GIL all the
while, so moving it to a thread would not free the event loop: 30,000 empty messages (990 KB, under the
body cap) cost 0.1-0.8 s of validation on the shared 2-core machine, 100,000 `logit_bias` entries
0.09-0.18 s. msgspec skims the same body in a few milliseconds, creating one small object per entry and
none per field. A body this cannot read (not JSON, not an object, `messages` not a list) is left to
pydantic, whose 400 names the field; a message that is not an object counts as one message without parts.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

# Bodies up to this size are validated at once and counted afterwards: at about 30 bytes a message they
# hold at most about a thousand messages, which pydantic validates in about a millisecond.
SHAPE_SCAN_BYTES = 32 * 1024
# Counted on their own: a prompt of token ids (up to the context), and messages and their parts.
_PROMPT = "prompt"


@dataclass(frozen=True)
class BodyCount:
    """A body's chat messages, the text parts of their contents, and its field with the most entries
    (list items or object members; messages and a token-id prompt aside)."""

    messages: int
    parts: int
    widest: tuple[str, int] | None = None
    prompt_ids: int = 0  # a token-id prompt's ids (or a text prompt's list entries)


class _Message(msgspec.Struct):
    """One message as far as counting needs it: its content, unparsed (other fields are skipped)."""

    content: msgspec.Raw = msgspec.Raw(b'""')


_top = msgspec.json.Decoder(dict[str, msgspec.Raw])
_items = msgspec.json.Decoder(list[msgspec.Raw])
_members = msgspec.json.Decoder(dict[str, msgspec.Raw])
_message = msgspec.json.Decoder(_Message)


def count_body(raw: bytes, limit: int, messages_field: str = "messages") -> BodyCount | None:
    """What a body carries, or None when it is not a JSON object; counting stops once a count is over
    `limit` (the count is then a lower bound, still over it). `messages_field` names the list of messages
    (the Responses API's is `input`, whose items' `content` parts are counted alike)."""
    try:
        fields = _top.decode(raw)
    except msgspec.DecodeError:  # ValidationError is one too
        return None
    widest: tuple[str, int] | None = None
    for name, value in fields.items():
        uncounted = name in (_PROMPT, messages_field)
        if not uncounted and (n := _entries(bytes(value))) > (widest[1] if widest else 0):
            widest = (name, n)
    prompt = fields.get("prompt")
    prompt_ids = _entries(bytes(prompt)) if prompt is not None else 0
    messages = fields.get(messages_field)
    items = _items.decode(messages) if messages is not None and bytes(messages).startswith(b"[") else []
    parts = 0
    if len(items) > limit:
        return BodyCount(len(items), parts, widest, prompt_ids)
    for item in items:
        try:
            content = bytes(_message.decode(item).content)
        except msgspec.DecodeError:
            continue
        if content.startswith(b"["):
            parts += len(_items.decode(content))
            if parts > limit:
                break
    return BodyCount(len(items), parts, widest, prompt_ids)


def _entries(value: bytes) -> int:
    """A list's items or an object's members (a raw span of valid JSON); 0 for anything else."""
    if value.startswith(b"["):
        return len(_items.decode(value))
    if value.startswith(b"{"):
        return len(_members.decode(value))
    return 0
