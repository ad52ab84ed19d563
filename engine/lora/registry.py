"""The engine's adapters: each name's slot and weights on the device, and those that failed to load.

Loaded once at engine start (`--lora NAME=PATH`). A directory that fails to load does not stop the
engine: its error is kept, logged, and given to each request that names it (and only to those).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from engine.lora.adapter import AdapterError, LoraAdapter, load_adapter
from engine.lora.cost import service_scale
from engine.lora.stack import LoraStack
from engine.models.config import ModelConfig
from engine.request import InvalidRequestError

log = logging.getLogger(__name__)


class LoraRegistry:
    """name -> adapter, in a fixed order (a batch names adapters by slot); `failed`: name -> error.

    `stack` holds every loaded adapter's weights, adapter i in slot i (None when none loaded)."""

    def __init__(self, adapters: list[LoraAdapter], failed: dict[str, str], stack: LoraStack | None) -> None:
        self.adapters = adapters
        self.slots = {adapter.name: i for i, adapter in enumerate(adapters)}
        self.failed = failed
        self.stack = stack

    @classmethod
    def load(
        cls,
        paths: Mapping[str, str],
        cfg: ModelConfig,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> LoraRegistry:
        """Every adapter of `paths` (name -> PEFT directory); a broken one is recorded, not raised."""
        adapters, failed = [], {}
        for name, path in paths.items():
            try:
                adapter = load_adapter(name, path, cfg, max_rank, dtype, device)
                adapter.service_scale = service_scale(cfg, adapter)
                adapters.append(adapter)
            except AdapterError as exc:
                log.error("LoRA %s", exc)
                failed[name] = str(exc)
        stack = None
        if adapters:
            # The set is fixed at start, so r_max is the largest loaded rank, not max_rank: every row's
            # shrink and expand run at r_max, and padding a rank-16 set to 64 would quadruple them.
            stack = LoraStack(cfg, len(adapters), max(a.rank for a in adapters), dtype, device)
            for slot, adapter in enumerate(adapters):
                stack.put(slot, adapter)
        return cls(adapters, failed, stack)

    @property
    def names(self) -> list[str]:
        """The adapters a request may name (those that loaded)."""
        return list(self.slots)

    def slot(self, name: str) -> int:
        """The adapter's position; InvalidRequestError (field `model`) if it is unknown or failed to load."""
        slot = self.slots.get(name)
        if slot is not None:
            return slot
        if name in self.failed:
            raise InvalidRequestError(self.failed[name], "model")
        raise InvalidRequestError(f"unknown LoRA adapter {name!r}", "model")
