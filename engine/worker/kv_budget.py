"""How many KV blocks an engine allocates when `num_kv_blocks` is not given: a share of the device's free
memory (of the host's RAM on CPU), less what its decode graphs take (engine/worker/decode_graphs.py)."""

from __future__ import annotations

import os

import torch

import engine.worker.decode_graphs as decode_graphs
from engine.config import EngineConfig
from engine.worker.decode_graphs import GraphPlan, logits_forward, uses_graphs
from engine.worker.loader import LoadedModel
from engine.worker.lora.resident import stack_bytes
from engine.worker.model_runner import has_window_pool, kv_block_bytes


def graph_plan(
    config: EngineConfig, device: torch.device, backend: str, max_model_len: int, vocab_size: int
) -> GraphPlan | None:
    """The decode graphs the engine captures, or None when every step runs eagerly."""
    if not uses_graphs(config.enforce_eager, device, backend):
        return None
    sizes = decode_graphs.batch_sizes(config.max_num_seqs, device)  # looked up here: tests pad on CPU
    return GraphPlan(sizes, max_model_len, config.block_size, vocab_size, backend, device)


def blocks_from_memory(
    config: EngineConfig, loaded: LoadedModel, max_model_len: int, graphs: GraphPlan | None
) -> int:
    """Blocks that fit the budget: `kv_fraction` of free memory, less the graphs' bytes and the LoRA slot
    stacks' largest size, at most what every seat filled to the full context would hold."""
    mc, device = loaded.config, torch.device(config.device)
    per_block = kv_block_bytes(mc.num_layers, config.block_size, mc.num_kv_heads, mc.head_dim, loaded.dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = int(free * config.kv_fraction())
    else:
        budget = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * config.kv_fraction())
    if device.type == "cuda" and config.tensor_parallel_size == 1:
        # LoRA slot stacks at their largest (engine/worker/lora/resident.py). On CPU they come out of the RAM that
        # kv_fraction leaves, as the rest of the host's allocations do: reserving them there took the whole
        # budget of a small-RAM configuration from engines that never see an adapter.
        budget -= stack_bytes(mc, config.max_loras, config.max_lora_rank, loaded.dtype)
    if graphs is not None:
        shape = (1, config.block_size, mc.num_kv_heads, mc.head_dim)
        windowed = not config.enable_prefix_caching and has_window_pool(loaded.model, mc.num_layers)
        # Under tensor parallelism a probe capture would run collectives the other ranks are not in: the
        # graphs' pool then comes out of the headroom kv_fraction leaves (docs/engine.md "Tensor parallelism").
        probe = config.tensor_parallel_size == 1
        budget -= graphs.measure(
            logits_forward(loaded.model), shape, loaded.dtype, mc.num_layers, windowed, probe=probe
        )
    useful = config.max_num_seqs * -(-max_model_len // config.block_size)
    return max(1, min(budget // per_block, useful))
