"""Shared helpers for admission tests: engine statistics as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """Satisfies admission.feasibility.LoadStats the way engine.EngineStats does."""

    waiting: int = 0
    running: int = 0
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)
    waiting_tokens: int = 0
    prefill_tokens_per_s: float = 1000.0
    decode_tokens_per_s: float = 100.0
    iteration_seconds: float = 0.01
    max_num_seqs: int = 8
