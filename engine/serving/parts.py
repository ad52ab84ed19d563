"""The engine's parts, each built from the one EngineConfig: what `LLMEngine._build` assembles.

Kept apart from engine/serving/llm_engine.py, whose job is the step, so that reading how a step runs does not
mean reading how a scheduler, a model runner and the grammar machinery are sized and wired at start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import torch

from engine.config import EngineConfig
from engine.core.async_scheduler import AsyncScheduler
from engine.core.isolation import RequestFailures
from engine.core.kv_cache import BlockPool
from engine.core.request import Request
from engine.core.scheduler import AdapterSlots, Scheduler, SchedulerConfig, Swap
from engine.core.step_cost import StepCost
from engine.core.step_cost import resolve as resolve_step_cost
from engine.core.tokenizer import Tokenizer
from engine.core.waits import Wait
from engine.worker.grammar.backend import Backend
from engine.worker.grammar.closing import Closers
from engine.worker.grammar.intake import GrammarIntake
from engine.worker.grammar.masks import GrammarMasks
from engine.worker.loader import LoadedModel
from engine.worker.lora.cost import attention_flop_ratio
from engine.worker.model_config import ModelConfig
from engine.worker.model_runner import ModelRunner, RunnerParts
from engine.worker.parallel.group import head_shard
from fairness.base import SchedulingPolicy


def engine_step_cost(config: EngineConfig, model: ModelConfig) -> StepCost:
    """The step cost model for `model` on this device kind: the configured coefficients, else its defaults."""
    return resolve_step_cost(
        config.device, attention_flop_ratio(model), config.step_cost_context, config.step_cost_sequence
    )


def charged_step_cost(config: EngineConfig, model: ModelConfig) -> StepCost | None:
    """The step cost model whose work the fair-share charge includes; None when it charges new tokens only."""
    return engine_step_cost(config, model) if config.step_cost_charge else None


def build_scheduler(
    config: EngineConfig,
    pool: BlockPool,
    policy: SchedulingPolicy[Request],
    max_model_len: int,
    model: ModelConfig,
    slots: AdapterSlots | None = None,
    swap: Swap | None = None,
    waits: Sequence[Wait] = (),
) -> Scheduler:
    """The scheduler of `config`'s budgets and step cost model (engine/core/step_cost.py, for `model` on this
    device kind); with async scheduling, the one that plans step N+1 while step N's forward runs
    (engine/core/async_scheduler.py)."""
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        max_model_len=max_model_len,
        watermark_blocks=config.watermark_blocks,
        preemption_mode=config.preemption_mode,
        step_cost=engine_step_cost(config, model),
        charge_step_work=config.step_cost_charge,
    )
    return (AsyncScheduler if config.overlaps() else Scheduler)(sched_cfg, pool, policy, slots, swap, waits)


def build_runner(
    config: EngineConfig,
    loaded: LoadedModel,
    num_blocks: int,
    backend: str,
    device: torch.device,
    parts: RunnerParts,
) -> ModelRunner:
    """Rank 0's model runner over its share of the KV cache (all of it without tensor parallelism), whole
    when built: its collaborators in `parts`, its decode graphs captured last."""
    mc = loaded.config
    world = config.tensor_parallel_size
    return ModelRunner(
        loaded.model,
        mc.num_layers,
        head_shard(mc.num_heads, mc.num_kv_heads, 0, world).kv_heads,  # this rank's share of the cache
        mc.head_dim,
        num_blocks,
        config.block_size,
        loaded.dtype,
        device,
        backend,
        config.seed,
        # Sliding layers free blocks behind their window only without prefix caching (engine/worker/window_cache.py).
        # Under tensor parallelism every layer stays in the BlockPool (no window pool to mirror on each rank).
        window_seats=None
        if config.enable_prefix_caching or parts.peers is not None
        else (config.max_num_seqs, config.max_num_batched_tokens),
        parts=parts,
    )


def grammar_masks(
    tokenizer: Tokenizer, vocab_size: int, eos_token_ids: set[int], max_model_len: int
) -> Callable[[RequestFailures], GrammarMasks]:
    """What builds the runner's grammar masks over its sampler's failures (engine/worker/grammar/masks.py)."""
    closers = partial(Closers, tokenizer.token_bytes, vocab_size, eos_token_ids)
    return lambda failures: GrammarMasks(vocab_size, failures, closers, max_model_len)


def build_grammar(
    config: EngineConfig, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: set[int], masks: GrammarMasks
) -> GrammarIntake:
    """Constrained decoding (engine/worker/grammar/): compiles off the engine loop, masks beside the forward; the
    runner holds the masks, the engine the intake that holds requests until their grammar is ready."""
    grammars = Backend(tokenizer.to_json(), vocab_size, sorted(eos_token_ids), config.grammar)
    return GrammarIntake(grammars, config.grammar, masks)
