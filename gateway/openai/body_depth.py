"""How deep a JSON body nests, measured before anything parses it, without recursion.

Every JSON parser the request path uses recurses per nesting level: msgspec (gateway/openai/body_shape.py)
and json.loads raise RecursionError at about a thousand levels, pydantic's parser stops at 200 with a bare
"recursion limit exceeded", and `copy.deepcopy` of a tool's parameters, `json.dumps` of a schema and the
grammar compile recurse again further on. 20,000 nested brackets in any field were a 500 (issue 54). So
the body's depth is measured first, on the raw bytes, with numpy: brackets outside strings (a quote
escaped by an odd run of backslashes does not open or close one) summed cumulatively. A body with no more
brackets than the limit (most of them) is passed after two `bytes.count`s; any other costs a few vector
passes, whatever its shape (about 15 ms for 1 MiB of brackets on the shared 2-core machine, loaded). Why numpy and
not a library: no maintained JSON library reports depth without parsing (and recursing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

_QUOTE, _BACKSLASH, _COLON = ord('"'), ord("\\"), ord(":")
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))


@dataclass(frozen=True)
class TooDeep:
    """A body nesting past the limit: how deep it goes, and the top-level field where (None: unknown)."""

    depth: int
    field: str | None


def too_deep(raw: bytes, limit: int) -> TooDeep | None:
    """TooDeep when `raw` nests more than `limit` levels (the top-level object is level 1), else None.
    Meant for JSON; on anything else it measures the brackets it finds, and the parser refuses it after."""
    if raw.count(b"[") + raw.count(b"{") <= limit:  # cannot nest deeper: most bodies stop here, in C
        return None
    data = np.frombuffer(raw, dtype=np.uint8)
    inside, quotes = _in_strings(data)
    opens = (data == _OPEN[0]) | (data == _OPEN[1])
    closes = (data == _CLOSE[0]) | (data == _CLOSE[1])
    step = opens.view(np.int8) - closes.view(np.int8)
    step[inside] = 0
    depth = np.cumsum(step, dtype=np.int32)
    deepest = int(depth.max())
    if deepest <= limit:
        return None
    first = int(np.argmax(depth > limit))
    return TooDeep(deepest, _top_level_field(raw, data, depth, inside, quotes, first))


def _in_strings(data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """True at every byte inside a JSON string (its opening quote included, its closing one not), and at
    every quote that opens or closes one."""
    quotes = data == _QUOTE
    if not quotes.any():
        return np.zeros(len(data), dtype=bool), quotes
    backslash = data == _BACKSLASH
    # The run of backslashes ending just before each byte: a quote after an odd run is escaped.
    count = np.cumsum(backslash, dtype=np.int32)
    reset = np.maximum.accumulate(np.where(backslash, 0, count))
    run = np.concatenate(([0], (count - reset)[:-1]))
    real = quotes & (run % 2 == 0)
    return np.cumsum(real, dtype=np.int32) & 1 == 1, real


def _top_level_field(
    raw: bytes, data: np.ndarray, depth: np.ndarray, inside: np.ndarray, quotes: np.ndarray, at: int
) -> str | None:
    """The top-level member whose value holds byte `at`: the key before the last top-level colon."""
    colons = np.flatnonzero((data[:at] == _COLON) & ~inside[:at] & (depth[:at] == 1))
    if not len(colons):
        return None
    bounds = np.flatnonzero(quotes[: int(colons[-1])])  # the key's opening and closing quotes, last
    if len(bounds) < 2:
        return None
    try:
        key = json.loads(raw[int(bounds[-2]) : int(bounds[-1]) + 1])
    except ValueError:
        return None
    return key if isinstance(key, str) else None
