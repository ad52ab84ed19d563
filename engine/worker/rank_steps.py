"""Rank 0's side of tensor parallelism: it starts the other ranks, and each step sends them its inputs.

One scheduler decides: rank 0 runs the scheduler, the fair-share policy and the sampler exactly as on a
single rank. Each forward's flat inputs (token ids, positions, slots, block table, query starts, sequence
lengths and the rows whose logits are taken) reach every other rank as one framed message on its stdin
pipe; the ranks then run the same forward, meeting in the model's all-reduces (engine/worker/parallel/group.py).

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

from engine.worker.parallel.group import COLLECTIVE_TIMEOUT, TPGroup, join_group, open_store

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.worker.host_batch import HostBatch

# The control messages (pickled tuples, the name first); a step is a StepMessage.
ALLOCATE, STOP = "allocate", "stop"
SWAP_OUT, SWAP_IN, DROP_SWAPPED = "swap_out", "swap_in", "drop_swapped"  # swap preemption, per shard
_HEADER = 8  # bytes of the little-endian payload length before each message, then one byte of kind
_PICKLED, _STEP = 0, 1
# How long a rank that was told to stop may take to exit before it is killed.
_EXIT_GRACE_S = 5.0
# How long a failed step looks for the rank that died (a live but broken one: the error says so after it).
_REAP_S = 1.0


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


@dataclass(frozen=True)
class StepMessage:
    """One forward's inputs as they crossed the pipe: a single int64 array (see `step_payload`)."""

    flat: np.ndarray


def frame(kind: int, data: bytes) -> bytes:
    """A message as written to a pipe: its length, its kind, its bytes."""
    return len(data).to_bytes(_HEADER, "little") + bytes((kind,)) + data


def write_frame(pipe: IO[bytes], payload: object) -> None:
    """Send one control message (pickled) down a pipe."""
    pipe.write(frame(_PICKLED, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)))
    pipe.flush()


def read_frame(pipe: IO[bytes]) -> Any:
    """The next message from a pipe (a StepMessage or a control message); None at end-of-file."""
    header = pipe.read(_HEADER + 1)
    if len(header) < _HEADER + 1:
        return None
    size = int.from_bytes(header[:_HEADER], "little")
    data = pipe.read(size)
    if len(data) < size:
        return None
    if header[_HEADER] == _STEP:
        return StepMessage(np.frombuffer(data, dtype=np.int64))
    return pickle.loads(data)


def step_payload(batch: HostBatch, ids: torch.Tensor) -> bytes:
    """A forward's inputs as one int64 array: six lengths (tokens, sequences, block-table columns, the
    longest query, sampled rows, block copies), then token ids, positions, slots, the block table, query
    starts, sequence lengths, the sampled rows and the (shared, fresh) block pairs to copy first. The ids
    are those rank 0 resolved (async scheduling's placeholders filled from the previous step's samples)."""
    host_ids = batch.ids if not batch.placeholders else ids.cpu()
    table = batch.table.numpy()
    rows = np.asarray(batch.sample_rows, dtype=np.int64)
    copies = np.asarray(batch.block_copies, dtype=np.int64).reshape(-1)
    head = np.array(
        [len(host_ids), table.shape[0], table.shape[1], batch.max_query_len, len(rows), len(copies) // 2],
        dtype=np.int64,
    )
    parts = (host_ids.numpy(), batch.positions.numpy(), batch.slots.numpy(), table.reshape(-1))
    tail = (batch.starts.numpy(), batch.seq_lens.numpy(), rows, copies)
    return np.concatenate([head, *parts, *tail], dtype=np.int64).tobytes()


def step_batch(message: StepMessage) -> HostBatch:
    """A worker's HostBatch from a step message (it samples nothing: `sampling` stays empty)."""
    from engine.worker.host_batch import HostBatch

    flat = message.flat
    tokens, seqs, cols, max_query_len, n_rows, n_copies = (int(v) for v in flat[:6])
    sizes = (tokens, tokens, tokens, seqs * cols, seqs + 1, seqs, n_rows, 2 * n_copies)
    bounds = np.cumsum((6, *sizes))
    ids, positions, slots, table, starts, seq_lens, rows, copies = np.split(flat, bounds[:-1])[1:]
    i32 = np.int32
    batch = HostBatch(
        torch.from_numpy(ids.copy()),
        torch.from_numpy(positions.copy()),
        torch.from_numpy(slots.copy()),
        torch.from_numpy(table.reshape(seqs, cols).astype(i32)),
        torch.from_numpy(starts.astype(i32)),
        torch.from_numpy(seq_lens.astype(i32)),
        max_query_len,
        rows.tolist(),
        [],
        False,
    )
    batch.block_copies = [(int(a), int(b)) for a, b in copies.reshape(-1, 2)]
    return batch


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
                    [sys.executable, "-m", "engine.worker.rank_worker"], stdin=subprocess.PIPE, env=env
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

    def allocate(self, num_blocks: int, graph_sizes: list[int] | None, max_model_len: int) -> None:
        """Tell every rank the KV cache size rank 0 chose, and the decode-graph buckets it captures (None:
        none), so each rank captures the same buckets and pads a step the same way; returns once all have
        their shard loaded and their cache allocated (one all-reduce, which fails at once if a rank died on
        the way). The ranks then capture, in step with rank 0 (engine/worker/decode_graphs.py), and `agree`."""
        self.send_control(ALLOCATE, num_blocks, graph_sizes, max_model_len)
        self.group.all_reduce(torch.zeros(1))

    def agree(self, captured: bool) -> bool:
        """Whether every rank captured its graphs (rank 0's `captured` and each peer's `agree_captured`)."""
        return agree_captured(self.group, captured)

    def send_control(self, *message: object) -> None:
        """A control message to every other rank (swap preemption), in order with the steps."""
        self._send(frame(_PICKLED, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)))

    def send_step(self, batch: HostBatch, ids: torch.Tensor) -> None:
        """Hand every other rank this forward's inputs (one message each)."""
        self._send(frame(_STEP, step_payload(batch, ids)))

    def lost(self, cause: BaseException) -> TensorParallelLost:
        """The error that ends the engine after `cause` (a collective or a pipe failed), naming the rank
        that died: its sockets close as it dies, a moment before its exit can be reaped, so this looks
        for up to a second."""
        deadline = time.monotonic() + _REAP_S
        while True:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code is not None:
                    return TensorParallelLost(f"tensor-parallel rank {rank} exited (code {code}): {cause}")
            if time.monotonic() > deadline:
                return TensorParallelLost(f"tensor-parallel step failed: {cause}")
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the other ranks (killed if they do not exit promptly) and drop the group."""
        _stop(self.procs)
        self.group.close()

    def _send(self, data: bytes) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.poll()
            if code is not None:
                raise TensorParallelLost(f"tensor-parallel rank {rank} exited (code {code})")
            assert proc.stdin is not None
            try:
                proc.stdin.write(data)
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


def agree_captured(group: TPGroup, captured: bool) -> bool:
    """One all-reduce of each rank's capture outcome: True only if all captured. A rank that replays a padded
    graph while another runs the step eagerly would meet it in collectives of different shapes, so one
    failed capture sends every rank to the eager path."""
    votes = group.all_reduce(torch.tensor([1.0 if captured else 0.0]))
    return int(votes.item()) == group.world
