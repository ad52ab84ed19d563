"""The tensor-parallel process group and the shard geometry every rank agrees on.

A standalone gloo (CPU) or NCCL (CUDA) group over a TCPStore, not torch's default group: an engine
process may build several engines (tests, benches), and each brings up and tears down its own group.
Collectives carry a timeout so a rank that stops answering ends the step with an error, never a hang;
a rank that dies is seen at once (its sockets close).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol, cast

import torch
from torch._C._distributed_c10d import ProcessGroupGloo, Store, TCPStore, Work

# How long a collective may wait for a rank that is alive but silent (a dead one is seen at once). Every
# rank runs the same forward, so a healthy peer is never this far behind; loading is bounded by it too.
COLLECTIVE_TIMEOUT = timedelta(seconds=120)


class Collectives(Protocol):
    """The two calls of a gloo or NCCL backend the model makes (torch's stubs list them on ProcessGroup only)."""

    def allreduce(self, tensors: list[torch.Tensor]) -> Work: ...

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor]) -> Work: ...


class TPGroup:
    """This rank's place in the group and the two collectives the model needs."""

    def __init__(self, rank: int, world: int, pg: Collectives) -> None:
        self.rank = rank
        self.world = world
        self.pg: Collectives | None = pg

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place (the row-parallel layers' partial products)."""
        self._pg().allreduce([t]).wait()
        return t

    def all_gather_last(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` concatenated along the last dimension, in rank order (vocab-parallel logits)."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.world)]
        self._pg().allgather([parts], [t]).wait()
        return torch.cat(parts, dim=-1)

    def close(self) -> None:
        """Drop the process group (its sockets close with it)."""
        self.pg = None

    def _pg(self) -> Collectives:
        if self.pg is None:
            raise RuntimeError("the tensor-parallel group is closed")
        return self.pg


def open_store(world: int, store_port: int | None = None) -> TCPStore:
    """Rank 0's rendezvous store on a free loopback port (`store_port` None; read it back from `.port`);
    the other ranks connect to rank 0's `store_port`. The ranks of one engine share its host."""
    master = store_port is None
    return TCPStore(
        "127.0.0.1",
        store_port or 0,
        world,
        is_master=master,
        timeout=COLLECTIVE_TIMEOUT,
        wait_for_workers=False,
    )


def join_group(store: Store, rank: int, world: int, device: torch.device) -> TPGroup:
    """Join the group (blocks until every rank has): NCCL on CUDA, gloo on CPU."""
    if device.type == "cuda":
        from torch._C._distributed_c10d import ProcessGroupNCCL  # absent from CPU builds of torch

        options = ProcessGroupNCCL.Options()
        options._timeout = COLLECTIVE_TIMEOUT
        return TPGroup(rank, world, cast(Collectives, ProcessGroupNCCL(store, rank, world, options)))
    return TPGroup(rank, world, cast(Collectives, ProcessGroupGloo(store, rank, world, COLLECTIVE_TIMEOUT)))


def rank_device(device: str, rank: int) -> torch.device:
    """The device of `rank`: on CUDA the rank-th GPU from the engine's own (cuda:N), else the engine's."""
    base = torch.device(device)
    if base.type != "cuda":
        return base
    return torch.device("cuda", (base.index or 0) + rank)


@dataclass(frozen=True)
class HeadShard:
    """Which attention heads a rank holds: a contiguous run of q heads and the KV heads they read.

    With fewer KV heads than ranks, each KV head is replicated on the ranks whose q heads share it.
    """

    q_heads: int
    q_start: int
    kv_heads: int
    kv_start: int


def head_shard(num_heads: int, num_kv_heads: int, rank: int, world: int) -> HeadShard:
    """This rank's heads; ValueError when the heads do not split evenly over `world` ranks."""
    if num_heads % world:
        raise ValueError(f"tensor_parallel_size {world} must divide num_attention_heads ({num_heads})")
    q = num_heads // world
    if num_kv_heads >= world:
        if num_kv_heads % world:
            raise ValueError(f"tensor_parallel_size {world} must divide num_key_value_heads ({num_kv_heads})")
        kv = num_kv_heads // world
        return HeadShard(q, rank * q, kv, rank * kv)
    if world % num_kv_heads:
        raise ValueError(
            f"with fewer KV heads ({num_kv_heads}) than ranks, tensor_parallel_size {world} "
            "must be a multiple of num_key_value_heads"
        )
    return HeadShard(q, rank * q, 1, rank * num_kv_heads // world)


def even_split(total: int, rank: int, world: int, what: str) -> tuple[int, int]:
    """(start, length) of this rank's equal share of `total`; ValueError naming `what` when uneven."""
    if total % world:
        raise ValueError(f"tensor_parallel_size {world} must divide {what} ({total})")
    part = total // world
    return rank * part, part


def vocab_split(vocab: int, rank: int, world: int) -> tuple[int, int, int]:
    """(start, rows, real rows) of this rank's vocabulary shard: every rank holds ceil(vocab / world) rows
    so the gathered logits line up, and the last rank's rows past the vocabulary are padding (zeros,
    their logits cut off after the gather)."""
    if vocab < world:
        raise ValueError(f"tensor_parallel_size {world} exceeds vocab_size ({vocab})")
    rows = -(-vocab // world)
    start = rank * rows
    return start, rows, max(0, min(rows, vocab - start))
