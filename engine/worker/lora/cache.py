"""Adapters on the device: `max_loras` slots, least recently used first out, those in flight pinned.

A step's adapted rows name their adapter by slot (engine/worker/lora/batch.py), so an adapter must hold a slot
while any request using it runs. The scheduler asks `acquire` before it admits an adapted request
(engine/worker/lora/intake.py `admissible`): an adapter already in a slot keeps it; otherwise it takes a free
slot, or evicts the least recently used adapter that no running request uses (the caller passes those,
`pinned`). With every slot pinned the request is not admitted this step and holds nothing.

`on_put(slot, adapter)` and `on_drop(slot)` tell the slots' stacked weights (engine/worker/lora/resident.py,
what the SGMV kernels read) that a slot now holds an adapter or was freed; a slot that changes adapter is
dropped, then put. Both run on the engine loop, inside scheduling, while with async scheduling the step
before may still be computing on its thread: that is why an adapter a step in flight reads is pinned too
(engine/worker/lora/intake.py `note_in_flight`), so the copy never lands in a slot a running forward reads.
The adapters kept here are the host copies; the device copy is the stack's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection

from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.host_cache import Key

SlotPut = Callable[[int, LoraAdapter], None]
SlotDrop = Callable[[int], None]


class DeviceSlots:
    """Which adapter each of `capacity` slots holds, in use order."""

    def __init__(self, capacity: int, on_put: SlotPut | None = None, on_drop: SlotDrop | None = None) -> None:
        self.adapters: list[LoraAdapter | None] = [None] * capacity  # by slot (host copies)
        self.on_put, self.on_drop = on_put, on_drop
        self._slots: OrderedDict[Key, int] = OrderedDict()  # least recently used first
        self.evictions = 0

    def slot(self, key: Key) -> int | None:
        """The slot holding `key`'s adapter, or None."""
        return self._slots.get(key)

    def acquire(self, key: Key, adapter: LoraAdapter, pinned: Collection[Key]) -> int | None:
        """A slot holding `key`'s adapter, now the most recently used: the one it holds, a free one, or the
        least recently used one not `pinned` (evicted); None when every slot holds a pinned adapter."""
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        slot = next((i for i, held in enumerate(self.adapters) if held is None), None)
        if slot is None:
            victim = next((k for k in self._slots if k not in pinned), None)
            if victim is None:
                return None
            slot = self._slots.pop(victim)
            self.adapters[slot] = None
            self.evictions += 1
            if self.on_drop is not None:
                self.on_drop(slot)
        if self.on_put is not None:
            try:
                self.on_put(slot, adapter)
            except (
                Exception
            ):  # the copy failed (engine/worker/lora/intake.py faults the adapter): the slot is free
                if self.on_drop is not None:
                    self.on_drop(slot)
                raise
        self.adapters[slot] = adapter
        self._slots[key] = slot
        return slot

    @property
    def keys(self) -> list[Key]:
        """The adapters in slots, least recently used first."""
        return list(self._slots)

    @property
    def in_use(self) -> bool:
        """Whether any slot holds an adapter (none: no step builds adapter groups)."""
        return bool(self._slots)
