"""Swap preemption's two moves for the scheduler: a victim's computed KV blocks to host memory, and back.

Both first wait for the forward in flight (async scheduling): it may still write the victim's blocks, or a
block just freed and handed to the request coming back. A swap-out that would pass `swap_space_bytes`
returns -1, and the scheduler recomputes the victim instead.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.kv_cache import BlockPool
from engine.core.request import Request
from engine.worker.model_runner import ModelRunner


class _Forwards(Protocol):
    def wait_forward(self) -> None: ...


class Swapper:
    """Moves requests' KV between the device cache and the runner's host buffer, within a byte budget."""

    def __init__(
        self, forwards: _Forwards, pool: BlockPool, runner: ModelRunner, block_bytes: int, space_bytes: int
    ) -> None:
        self.forwards, self.pool, self.runner = forwards, pool, runner
        self.block_bytes, self.space_bytes = block_bytes, space_bytes

    def swap_out(self, request: Request) -> int:
        """Copy the request's computed blocks out; the bytes moved, or -1 when the buffer is full."""
        self.forwards.wait_forward()
        ids = self.pool.block_ids(request.request_id)[
            : -(-request.num_computed_tokens // self.pool.block_size)
        ]
        if self.runner.swapped_bytes() + self.block_bytes * len(ids) > self.space_bytes:
            return -1
        return self.runner.swap_out(request.request_id, ids)

    def swap_in(self, request: Request) -> int:
        """Copy the request's blocks back into the blocks the pool has just given it."""
        self.forwards.wait_forward()
        return self.runner.swap_in(request.request_id, self.pool.block_ids(request.request_id))
