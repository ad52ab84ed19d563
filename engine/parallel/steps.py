"""Rank 0's side of tensor parallelism: it starts the other ranks, and each step sends them its inputs.

One scheduler decides: rank 0 runs the scheduler, the fair-share policy and the sampler exactly as on a
single rank. Each forward's flat inputs (token ids, positions, slots, block table, query starts, sequence
lengths and the rows whose logits are taken) reach every other rank as one framed message on its stdin
pipe; the ranks then run the same forward, meeting in the model's all-reduces (engine/parallel/group.py).

A pipe, not a collective, carries the step: a rank waiting for the next step may wait for as long as the
engine is idle, which a collective's timeout would not allow, and it reads end-of-file the moment rank 0
dies. A rank that dies is seen by rank 0 at once: its process has exited (checked before each step), its
pipe is broken, or the collective it left fails. Each ends the step with `TensorParallelLost`, which takes
the engine down as one unit (the engine-lost path, docs/engine.md).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import torch

from engine.parallel.group import COLLECTIVE_TIMEOUT, TPGroup, join_group, open_store

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.model_runner import HostBatch

FORWARD, ALLOCATE, STOP = "forward", "allocate", "stop"
_HEADER = 8  # bytes of the little-endian payload length before each message
# How long a rank that was told to stop may take to exit before it is killed.
_EXIT_GRACE_S = 5.0


class TensorParallelLost(RuntimeError):
    """A tensor-parallel rank died or stopped answering: the engine cannot run another step."""


@dataclass(frozen=True)
class WorkerInit:
    """What a rank > 0 needs to build its shard: the engine's config, its place, the rendezvous port."""

    config: EngineConfig
    rank: int
    world: int
    store_port: int
    num_threads: int


def write_frame(pipe: IO[bytes], payload: object) -> None:
    """Send one message (pickled, length-prefixed) down a pipe."""
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(len(data).to_bytes(_HEADER, "little") + data)
    pipe.flush()


def read_frame(pipe: IO[bytes]) -> Any:
    """The next message from a pipe; None at end-of-file (rank 0 is gone)."""
    header = pipe.read(_HEADER)
    if len(header) < _HEADER:
        return None
    size = int.from_bytes(header, "little")
    data = pipe.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def step_message(batch: HostBatch, ids: torch.Tensor) -> tuple[object, ...]:
    """A forward's inputs as one message: host arrays, with the ids rank 0 already resolved (async
    scheduling's placeholders filled from the previous step's samples)."""
    host_ids = batch.ids if not batch.placeholders else ids.cpu()
    return (
        FORWARD,
        host_ids.numpy(),
        batch.positions.numpy(),
        batch.slots.numpy(),
        batch.table.numpy(),
        batch.starts.numpy(),
        batch.seq_lens.numpy(),
        batch.max_query_len,
        batch.sample_rows,
    )


def step_batch(message: tuple[Any, ...]) -> HostBatch:
    """A worker's HostBatch from a step message (it samples nothing: `sampling` stays empty)."""
    from engine.model_runner import HostBatch

    _, ids, positions, slots, table, starts, seq_lens, max_query_len, sample_rows = message
    ids_t, positions_t, slots_t, table_t, starts_t, seq_lens_t = (
        torch.from_numpy(np.asarray(a)) for a in (ids, positions, slots, table, starts, seq_lens)
    )
    return HostBatch(
        ids_t,
        positions_t,
        slots_t,
        table_t,
        starts_t,
        seq_lens_t,
        max_query_len,
        list(sample_rows),
        [],
        False,
    )


class StepPeers:
    """The ranks 1..N-1 of one engine: their processes and pipes, and rank 0's group handle."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], group: TPGroup) -> None:
        self.procs = procs
        self.group = group

    @classmethod
    def start(cls, config: EngineConfig) -> StepPeers:
        """Start ranks 1..N-1 and join the group with them (rank 0 is this process)."""
        world = config.tensor_parallel_size
        store = open_store(world)
        threads = max(1, torch.get_num_threads() // world)
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the `engine` package
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(1, world):
                proc = subprocess.Popen(
                    [sys.executable, "-m", "engine.parallel.worker"], stdin=subprocess.PIPE, env=env
                )
                procs.append(proc)
                assert proc.stdin is not None
                write_frame(proc.stdin, WorkerInit(config, rank, world, store.port, threads))
            _await_ranks(store, procs)
            group = join_group(store, 0, world, torch.device(config.device))
        except BaseException:
            _stop(procs)
            raise
        return cls(procs, group)

    def allocate(self, num_blocks: int) -> None:
        """Tell every rank the KV cache size rank 0 chose; returns once all have their shard loaded and
        their cache allocated (one all-reduce, which fails at once if a rank died on the way)."""
        self._broadcast((ALLOCATE, num_blocks))
        self.group.all_reduce(torch.zeros(1))

    def send_step(self, batch: HostBatch, ids: torch.Tensor) -> None:
        """Hand every other rank this forward's inputs (one message each)."""
        self._broadcast(step_message(batch, ids))

    def lost(self, cause: BaseException) -> TensorParallelLost:
        """The error that ends the engine after `cause` (a collective or a pipe failed): names a dead rank."""
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                return TensorParallelLost(f"tensor-parallel rank {rank} exited (code {code}): {cause}")
        return TensorParallelLost(f"tensor-parallel step failed: {cause}")

    def close(self) -> None:
        """Stop the other ranks (killed if they do not exit promptly) and drop the group."""
        _stop(self.procs)
        self.group.close()

    def _broadcast(self, message: tuple[object, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = len(data).to_bytes(_HEADER, "little") + data
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise TensorParallelLost(f"tensor-parallel rank {rank} exited (code {code})")
            assert proc.stdin is not None
            try:
                proc.stdin.write(frame)
                proc.stdin.flush()
            except OSError as exc:
                raise self.lost(exc) from exc


def _await_ranks(store: Any, procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait until every rank has reached the rendezvous, failing at once if one exits on the way."""
    deadline = time.monotonic() + COLLECTIVE_TIMEOUT.total_seconds()
    for rank, proc in enumerate(procs, start=1):
        while not store.check([f"joining/{rank}"]):
            if proc.poll() is not None:
                raise TensorParallelLost(
                    f"tensor-parallel rank {rank} exited while starting (code {proc.returncode})"
                )
            if time.monotonic() > deadline:
                raise TensorParallelLost(f"tensor-parallel rank {rank} did not start in time")
            time.sleep(0.01)  # a poll of the store and the process: starting takes seconds


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None and proc.stdin is not None:
            try:
                write_frame(proc.stdin, (STOP,))
                proc.stdin.close()
            except OSError:
                pass
    deadline = time.monotonic() + _EXIT_GRACE_S
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
