"""The main of a tensor-parallel rank > 0: load its shard, allocate its KV cache, run each step it is sent.

Started by rank 0 (engine/worker/rank_steps.py) as `python -m engine.worker.rank_worker`, its first message on
stdin says who it is. It samples nothing and schedules nothing: it runs the forward rank 0 describes, the
model's collectives keeping it in lockstep. It ends on STOP, at end-of-file (rank 0 is gone), or when a
collective fails (another rank is gone), so it never outlives its engine.
"""

from __future__ import annotations

import os
import signal
import sys
from functools import partial

import torch

from engine.worker.attention import resolve_backend
from engine.worker.decode_graphs import GraphPlan
from engine.worker.loader import load_model
from engine.worker.model_runner import ModelRunner, RunnerParts
from engine.worker.parallel.group import head_shard, join_group, open_store, rank_device
from engine.worker.rank_steps import (
    ALLOCATE,
    DROP_SWAPPED,
    STOP,
    SWAP_IN,
    SWAP_OUT,
    StepMessage,
    WorkerInit,
    agree_captured,
    read_frame,
    step_batch,
)


def serve(init: WorkerInit) -> None:
    """Join the group, build this rank's shard and serve steps until told to stop."""
    config, rank, world = init.config, init.rank, init.world
    torch.set_num_threads(init.num_threads)
    store = open_store(world, init.store_port)
    store.set(f"joining/{rank}", "1")
    device = rank_device(config.device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = join_group(store, rank, world, device)
    loaded = load_model(
        config.model, dtype=config.dtype, device=str(device), cache_dir=config.cache_dir, tp=group
    )
    mc = loaded.config
    stdin = sys.stdin.buffer
    message = read_frame(stdin)
    if message is None or message[0] != ALLOCATE:
        return
    backend = resolve_backend(config.attention_backend, device)
    graph_sizes, max_model_len = message[2], message[3]
    # rank 0's buckets (None: none), captured in step with it, their collectives inside
    plan = (
        None
        if graph_sizes is None
        else GraphPlan(graph_sizes, max_model_len, config.block_size, mc.vocab_size, backend, device)
    )
    parts = RunnerParts(
        graphs=plan,
        agree=partial(agree_captured, group),
        allocated=lambda: group.all_reduce(torch.zeros(1)),  # ready: rank 0's `allocate` returns
    )
    runner = ModelRunner(
        loaded.model,
        mc.num_layers,
        head_shard(mc.num_heads, mc.num_kv_heads, rank, world).kv_heads,
        mc.head_dim,
        int(message[1]),
        config.block_size,
        loaded.dtype,
        device,
        backend,
        config.seed,
        parts=parts,
    )
    while (message := read_frame(stdin)) is not None:
        if isinstance(message, StepMessage):
            runner.run_peer_step(step_batch(message))
        elif message[0] == SWAP_OUT:
            runner.swap_out(message[1], message[2])
        elif message[0] == SWAP_IN:
            runner.swap_in(message[1], message[2])
        elif message[0] == DROP_SWAPPED:
            runner.drop_swapped(message[1])
        elif message[0] == STOP:
            break


def main() -> None:
    """Read the init message and serve; the engine's owner signals rank 0, never this process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init = read_frame(sys.stdin.buffer)
    if not isinstance(init, WorkerInit):
        sys.exit("engine.worker.rank_worker: expected a WorkerInit message on stdin")
    try:
        serve(init)
    except Exception as exc:  # another rank is gone (a failed collective) or this one cannot load
        print(f"tensor-parallel rank {init.rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(1)  # at once: no interpreter teardown under a broken process group


if __name__ == "__main__":
    main()
