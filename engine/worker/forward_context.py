"""The step's forward context: what one forward carries beside its attention layout.

Today that is the step's LoRA batch (the rows grouped by adapter, engine/worker/lora/batch.py), which is
not attention data and so no longer rides in `AttentionMetadata` (issue 55). The runner sets it around
the eager forward (`step_context`); the LoRA-aware projections read it (`step_lora`), as vLLM's layers
read `get_forward_context()`. A decode graph is captured and replayed outside any context, so it holds no
adapter rows, which is why a step with adapted rows runs eagerly (docs/engine.md, "LoRA adapters").

A `ContextVar` rather than a module global: two engines in one process (tests, `fairserve sim`'s peers,
threads of a server) each see their own step's batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from engine.worker.lora.batch import LoraBatch

_LORA: ContextVar[LoraBatch | None] = ContextVar("fairserve_step_lora", default=None)


@contextmanager
def step_context(lora: LoraBatch | None) -> Iterator[None]:
    """Run a forward with `lora` as its step's LoRA batch (None: no row is adapted)."""
    token = _LORA.set(lora)
    try:
        yield
    finally:
        _LORA.reset(token)


def step_lora() -> LoraBatch | None:
    """The LoRA batch of the forward running now; None outside a step or when no row is adapted."""
    return _LORA.get()
