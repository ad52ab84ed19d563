"""Helpers for adapters named at run time (RequestMeta.lora_path): a loader held open by the test, and an
engine stepped to the end with the pinning invariant checked at every step."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine import LLMEngine
from engine.core.errors import InvalidRequestError
from engine.core.request import Request, RequestState
from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.host_cache import Loader


@dataclass
class GatedLoader:
    """The engine's own loader, each call waiting for `gate` once it has begun (`entered`); counts calls."""

    load: Loader
    gate: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    calls: list[str] = field(default_factory=list)

    def __call__(self, name: str, path: str) -> LoraAdapter:
        self.calls.append(name)
        self.entered.set()
        assert self.gate.wait(timeout=60), "the test never opened the gate"
        return self.load(name, path)


def gate(engine: LLMEngine, open_: bool = False) -> GatedLoader:
    """Put a GatedLoader in front of the engine's loader (open at once unless `open_` is False)."""
    gated = GatedLoader(engine.lora.host.load)
    if open_:
        gated.gate.set()
    engine.lora.host.load = gated
    return gated


@dataclass
class Finished:
    """What stepping an engine to the end produced."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    refused: dict[str, InvalidRequestError] = field(default_factory=dict)


def run_checked(engine: LLMEngine, out: Finished | None = None) -> Finished:
    """Step until nothing is left, checking after every step that each running adapted request's adapter
    holds a device slot (in-flight adapters are pinned) and that no parked request holds a seat or blocks."""
    out = out or Finished()
    while engine.has_unfinished():
        for delta in engine.step_deltas():
            out.tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
        for request_id, exc in engine.take_refused():
            out.refused[request_id] = exc
        for request in engine.scheduler.running:
            if request.meta.lora is not None:
                slot = engine.lora.slot(request)
                assert slot is not None, f"{request.request_id}'s adapter lost its slot while it runs"
                held = engine.lora.slots.adapters[slot]
                assert held is not None and held.name == request.meta.lora
        for parked in held_for_adapter(engine):
            assert parked not in engine.scheduler.running
            assert not engine.pool.block_ids(parked.request_id)
    return out


def held_for_adapter(engine: LLMEngine) -> list[Request]:
    """The requests the scheduler holds for their adapter's load (engine/core/waits.py)."""
    live = engine.scheduler.requests.values()
    return [r for r in live if r.state is RequestState.WAITING_FOR_ADAPTER]
