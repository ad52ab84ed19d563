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
    # Where the iteration's time went (perf_counter seconds), so host overhead can be read off a real
    # deployment as well as off experiments/host_overhead.py. Everything but `forward_s` is host work the
    # accelerator waits through unless it overlaps a forward.
    schedule_s: float = 0.0  # Scheduler.schedule: retire, expire, decode/prefill chunks, admission, charging
    prepare_s: float = 0.0  # ModelRunner.prepare: token ids, positions, slot mapping, block tables
    forward_s: float = 0.0  # the model's forward and logits (on a GPU: launch plus the wait at sampling)
    sample_s: float = 0.0  # Sampler.sample and the copy of the sampled ids to the host
    update_s: float = 0.0  # Scheduler.update: append tokens, token-level stops, block hashes
    outputs_s: float = 0.0  # detokenization, stop strings and the per-request outputs
    # Async scheduling (EngineConfig.async_scheduling, engine/core/async_scheduler.py): schedule_s and prepare_s
    # are then the next step's, built while this one's forward ran; overlapped_s is how much of that the
    # forward hid, wait_s how long the host then waited for this step's samples, discarded_tokens this
    # step's tokens thrown away because the step before ended their requests.
    overlapped_s: float = 0.0
    wait_s: float = 0.0
    discarded_tokens: int = 0


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
