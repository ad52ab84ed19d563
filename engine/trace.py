"""One row per engine iteration: what was queued, what ran, what it cost."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import IO


@dataclass
class IterationTrace:
    """A snapshot of one scheduler iteration, written as a JSON line when tracing is on."""

    iteration: int
    time: float
    waiting: int
    running: int
    prefill_tokens: int
    decode_tokens: int
    kv_blocks_used: int
    kv_blocks_free: int
    preemptions: int
    completions: int
    seconds: float
    cached_tokens: int = 0
    waiting_for_blocks: int = 0


class TraceWriter:
    """Appends IterationTrace rows to a JSON-lines file."""

    def __init__(self, path: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the engine

    def write(self, row: IterationTrace) -> None:
        """Write one row and flush, so a crash loses at most the current line."""
        self._file.write(json.dumps(asdict(row)) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()
