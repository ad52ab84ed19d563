"""Turns a SchedulerOutput into one flat forward pass over a mixed prefill/decode batch, then samples."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import cast

import numpy as np
import torch
from torch import nn

from engine.core.errors import RequestFault
from engine.core.isolation import RequestFailures
from engine.core.request import Request
from engine.core.scheduler import SchedulerOutput
from engine.worker.attention import AttentionMetadata, KVCache
from engine.worker.decode_graphs import DecodeGraphs, GraphPlan, logits_forward
from engine.worker.forward_context import step_context
from engine.worker.grammar.masks import GrammarMasks
from engine.worker.host_batch import HostBatch, chunks_batch, one_token_each_batch
from engine.worker.input_batch import BlockTableRows
from engine.worker.kv_copy import copy_blocks
from engine.worker.lora.batch import LoraBatch, LoraSegments, device_batch, host_groups
from engine.worker.lora.intake import LoraIntake
from engine.worker.model_config import ModelConfig
from engine.worker.models.protocol import CausalLM
from engine.worker.rank_steps import DROP_SWAPPED, SWAP_IN, SWAP_OUT, StepPeers
from engine.worker.sampler import Sampler, to_device
from engine.worker.window_cache import WindowBlocks, pool_blocks

log = logging.getLogger(__name__)


def kv_block_bytes(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one block occupies across all layers, K and V."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


@dataclass
class RunnerTiming:
    """perf_counter seconds of the last `execute`, per phase (read into the IterationTrace)."""

    prepare_s: float = 0.0
    forward_s: float = 0.0
    sample_s: float = 0.0


@dataclass(frozen=True)
class RunnerParts:
    """A runner's collaborators, each built before it (engine/serving/parts.py), so that `ModelRunner.__init__`
    says everything a runner holds, in the order the engine starts: the KV cache, then the graphs' capture."""

    peers: StepPeers | None = None  # tensor parallelism: ranks 1..N-1, sent each step (rank 0 only)
    lora: LoraIntake | None = None  # LoRA adapters' device slots (engine/worker/lora/)
    # Builds the grammar masks over the sampler's failures (one request's failing mask fails that request).
    grammar: Callable[[RequestFailures], GrammarMasks] | None = None
    graphs: GraphPlan | None = None  # the decode graphs to capture once the KV cache exists
    agree: Callable[[bool], bool] | None = None  # every rank's capture outcome, all-reduced (tensor parallel)
    allocated: Callable[[], object] | None = None  # told once this rank's KV cache exists (ranks 1..N-1)


class ModelRunner:
    """Owns the model, the paged KV cache tensors and the sampler."""

    def __init__(
        self,
        model: nn.Module,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        backend: str,
        seed: int,
        window_seats: tuple[int, int] | None = None,
        parts: RunnerParts | None = None,
    ) -> None:
        parts = parts or RunnerParts()
        self.model = model
        self.block_size = block_size
        self.device = device
        self.backend = backend
        # window_seats (max_num_seqs, max_num_batched_tokens), given when prefix caching is off: a model
        # mixing sliding-window and full layers keeps the sliding layers' KV in a pool that frees blocks
        # behind the window (engine/worker/window_cache.py); the BlockPool's blocks back the other layers.
        self.window_layers, window = _mixed_window_layers(model, num_layers) if window_seats else ([], 0)
        self.windows: WindowBlocks | None = None
        if self.window_layers and window_seats:
            size = pool_blocks(window, block_size, *window_seats)
            kv_shape = (num_kv_heads, head_dim)
            self.windows = WindowBlocks(
                window, block_size, len(self.window_layers), kv_shape, dtype, device, size
            )
        self.main_layers = [i for i in range(num_layers) if i not in self.window_layers]
        # Decode steps replay these (engine/worker/decode_graphs.py): none until they are captured, last, below.
        self.graphs: DecodeGraphs | None = None
        # Tensor parallelism (engine/worker/parallel/): the other ranks, sent each forward's inputs; None on one rank.
        self.peers = parts.peers
        # LoRA adapters (engine/worker/lora/): each request's device slot; None: no row is adapted.
        self.lora = parts.lora
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches: list[KVCache] = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            if i in self.main_layers
            else (torch.empty(0), torch.empty(0))
            for i in range(num_layers)
        ]
        self._sync_window_caches()
        self.sampler = Sampler(seed)
        # Constrained decoding's masks (engine/worker/grammar/): a failing mask fails its row, as the sampler's do.
        self.grammar = None if parts.grammar is None else parts.grammar(self.sampler.failures)
        self.timing = RunnerTiming()
        self.block_rows = BlockTableRows()
        self._swapped: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._swapped_windows: dict[str, tuple[list[int], list[KVCache]]] = {}
        self.graphs = self._capture(parts)  # over the KV cache just allocated

    def _capture(self, parts: RunnerParts) -> DecodeGraphs | None:
        """The decode graphs of `parts.graphs`, or None (eager steps). Under tensor parallelism every rank
        captures the same buckets in step (`allocated` first tells rank 0 this rank's cache exists), and one
        rank's failure sends all of them to eager (`agree`)."""
        if parts.allocated is not None:
            parts.allocated()
        if parts.graphs is None:
            return None
        graphs = parts.graphs.start(logits_forward(self.model), self.kv_caches, self.windows is not None)
        if parts.agree is not None and not parts.agree(graphs is not None):
            return None
        return graphs

    def prepare(
        self, out: SchedulerOutput, block_tables: dict[str, list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the batch: token ids, positions, attention metadata, and the rows whose logits are sampled."""
        batch = self.prepare_host(out, block_tables)
        ids, positions, meta = self._to_device(batch)
        return ids, positions, meta, batch.sample_rows

    def prepare_host(self, out: SchedulerOutput, block_tables: dict[str, list[int]]) -> HostBatch:
        """`prepare`'s host half: everything but the copy to the device (async scheduling builds this while
        the previous step's forward runs)."""
        chunks = out.chunks
        ids = [c.request.request_id for c in chunks]
        lists = [block_tables[i] for i in ids]
        table = self.block_rows.gather(self.block_rows.rows(ids, lists), max(map(len, lists), default=1))
        if out.num_batched_tokens == len(chunks):
            batch = one_token_each_batch(out, table, self.block_size)
        else:
            batch = chunks_batch(out, torch.from_numpy(table), self.block_size)
        if self.windows is not None:
            batch.window_slots, batch.window_table = self._window_layout(out, batch, self.windows)
        if self.lora is not None and self.lora.slots.in_use:
            batch.lora_groups = self._lora_groups(out, self.lora)
            batch.lora_stack = self.lora.stack.stack
        if out.forked:  # choices forked this step sample from their leader's row (engine/core/family.py)
            row_of = {id(r): row for r, row in zip(batch.sampling, batch.sample_rows, strict=True)}
            for follower in out.forked:
                assert follower.family is not None
                batch.sample_rows.append(row_of[id(follower.family.leader)])
                batch.sampling.append(follower)
        batch.block_copies = out.block_copies
        return batch

    @staticmethod
    def _lora_groups(out: SchedulerOutput, lora: LoraIntake) -> LoraSegments | None:
        """The step's adapted rows as segments per device slot (a running request's adapter is pinned in its
        slot, engine/worker/lora/cache.py)."""
        slots = [lora.slot(c.request) for c in out.chunks]
        if all(slot is None for slot in slots):
            return None
        return host_groups(slots, [c.length for c in out.chunks])

    def _window_layout(
        self, out: SchedulerOutput, batch: HostBatch, windows: WindowBlocks
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sliding-window group's slots and block table for the batch, freeing what fell behind."""
        scheduled = {c.request.request_id for c in out.chunks}
        for victim, record in out.preempted:
            # Recompute restarts it from 0 (a claim from 0 starts afresh anyway); a swap already saved and
            # freed its blocks, and may have restored them within this very step.
            if record.mode == "recompute" and victim.request_id not in scheduled:
                windows.release(victim.request_id)
        windows.trim_idle(scheduled)
        rows = [windows.claim(c.request.request_id, c.start, c.start + c.length) for c in out.chunks]
        table = np.zeros((len(rows), max(map(len, rows), default=1)), dtype=np.int64)
        for r, row in enumerate(rows):
            table[r, : len(row)] = row
        self._sync_window_caches()
        positions = batch.positions.numpy()
        token_rows = np.repeat(np.arange(len(rows)), np.diff(batch.starts.numpy()))
        bs = self.block_size
        slots = table[token_rows, positions // bs] * bs + positions % bs
        return torch.from_numpy(slots), torch.from_numpy(table)

    def _sync_window_caches(self) -> None:
        """Point the sliding layers at the window pool's tensors (new ones after it grew)."""
        if self.windows is not None:
            for layer, cache in zip(self.window_layers, self.windows.caches, strict=True):
                self.kv_caches[layer] = cache
            if self.graphs is not None and not self.graphs.bound_to(self.kv_caches):
                # The graphs hold the old tensors' addresses. The pool is sized so that it never grows
                # (engine/worker/window_cache.py); should it, decode steps run eagerly from here on.
                log.warning("the sliding-window pool grew past its bound: decode steps run eagerly now")
                self.graphs = None

    def _to_device(self, batch: HostBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        dev = self.device
        ids = self._input_ids(batch)
        meta = AttentionMetadata(
            slot_mapping=batch.slots.to(dev),
            block_tables=batch.table.to(dev),
            query_start_loc=batch.starts.to(dev),
            seq_lens=batch.seq_lens.to(dev),
            max_query_len=batch.max_query_len,
            max_seq_len=int(batch.seq_lens.max()) if len(batch.seq_lens) else 0,
            backend=self.backend,
        )
        if batch.window_slots is not None and batch.window_table is not None:
            meta.window_group = replace(
                meta, slot_mapping=batch.window_slots.to(dev), block_tables=batch.window_table.to(dev)
            )
        return ids, batch.positions.to(dev), meta

    def _input_ids(self, batch: HostBatch) -> torch.Tensor:
        """The batch's token ids on the device."""
        ids = batch.ids.to(self.device)
        if batch.placeholders:
            # Async scheduling: a token sampled by the previous forward is still a placeholder in the host
            # lists, -(1 + its row); it is taken from that forward's sampled ids where they are (on a GPU,
            # without a copy to the host and back), so this step need not wait for them.
            prev = self.sampler.last_sampled
            if prev is None or not len(prev):
                raise RuntimeError("a placeholder token without the previous step's samples")
            ids = torch.where(ids < 0, prev[(-ids - 1).clamp(0, len(prev) - 1)], ids)
        return ids

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, block_tables: dict[str, list[int]]) -> dict[str, int]:
        """Run the model once on the batch; return the sampled token of every request whose chunk completes."""
        if not out.chunks:
            self.timing = RunnerTiming()
            return {}
        t0 = time.perf_counter()
        batch = self.prepare_host(out, block_tables)
        prepare_s = time.perf_counter() - t0
        sampled = self.run(batch)
        self.timing.prepare_s = prepare_s
        return sampled

    @torch.inference_mode()
    def run(self, batch: HostBatch) -> dict[str, int]:
        """The forward pass and sampling of a prepared batch (async scheduling runs this on a thread of its own)."""
        timing = self.timing = RunnerTiming()
        t1 = time.perf_counter()
        sampling, grammar = batch.sampling, self.grammar
        masks = grammar.begin(sampling) if grammar else None  # computed beside the forward
        copy_blocks(self.kv_caches, self.main_layers, batch.block_copies, self.device)
        logits = self._logits(batch)
        if logits is None or not sampling:
            self.sampler.last_sampled = None
            timing.forward_s = time.perf_counter() - t1
            return {}
        t2 = time.perf_counter()
        if batch.lora_groups is not None:
            self._check_adapted_rows(logits, sampling)
        if masks is not None and grammar is not None:
            grammar.apply(masks, logits)
        tokens = self.sampler.sample(logits, sampling)
        if grammar:
            grammar.accept(sampling, tokens)
        sampled = {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}
        timing.forward_s, timing.sample_s = t2 - t1, time.perf_counter() - t2
        return sampled

    def _check_adapted_rows(self, logits: torch.Tensor, sampling: Sequence[Request]) -> None:
        """Fail alone each adapted row whose logits are not finite: an adapter's weights overflowed in the
        forward. Its delta reaches only its own rows (engine/worker/lora/apply.py), so the other rows are as the
        base model or their own adapter made them. Only steps with adapted rows pay for the check."""
        rows = [i for i, r in enumerate(sampling) if r.meta.lora is not None]
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        finite = torch.isfinite(logits.index_select(0, index)).all(dim=-1).tolist()
        for i, ok in zip(rows, finite, strict=True):
            if not ok:
                request = sampling[i]
                error = f"adapter {request.meta.lora!r} produced values that are not finite"
                self.sampler.failures.run(
                    request.request_id, partial(_raise, RequestFault(error, "model")), None
                )

    def _logits(self, batch: HostBatch) -> torch.Tensor | None:
        """The logits of the batch's sample rows (None when no row samples): a decode step a graph holds
        replays it over the static inputs (engine/worker/decode_graphs.py); any other step runs eagerly."""
        graphs = self.graphs
        # A step with adapted rows runs eagerly: the graphs' static inputs hold no adapter rows (docs/engine.md).
        run: Callable[[], torch.Tensor | None]
        ids: torch.Tensor | None = None
        if graphs is not None and batch.lora_groups is None and graphs.serves(batch):
            # The host's ids travel in the graph inputs' one upload; their placeholders are filled there.
            run = partial(graphs.run, batch, None, self.sampler.last_sampled)
        else:
            ids, positions, meta = self._to_device(batch)
            run = partial(self._forward, ids, positions, meta, batch.sample_rows, self._lora_batch(batch))
        if self.peers is None:
            return run()
        try:  # every rank replays the same bucket (or runs the same eager step): engine/worker/rank_worker.py
            self.peers.send_step(batch, self._input_ids(batch) if ids is None else ids)
            return run()
        except RuntimeError as exc:  # a collective failed: another rank is gone
            raise self.peers.lost(exc) from exc

    @torch.inference_mode()
    def run_peer_step(self, batch: HostBatch) -> None:
        """A tensor-parallel rank > 0's share of a step rank 0 sent (engine/worker/rank_worker.py): the same
        forward and logits, whose collectives meet rank 0's; rank 0 samples. A decode step rank 0 replays
        a graph for is replayed here too, over the same bucket (the ranks captured the same ones)."""
        copy_blocks(self.kv_caches, self.main_layers, batch.block_copies, self.device)
        if self.graphs is not None and self.graphs.serves(batch):
            self.graphs.run(batch, self._input_ids(batch))
            return
        ids, positions, meta = self._to_device(batch)
        self._forward(ids, positions, meta, batch.sample_rows, self._lora_batch(batch))

    def _lora_batch(self, batch: HostBatch) -> LoraBatch | None:
        """The step's adapted rows on the device, for its forward context; None when no row is adapted."""
        if batch.lora_groups is None or batch.lora_stack is None:
            return None
        return device_batch(batch.lora_stack, batch.lora_groups, self.device)

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        sample_rows: list[int],
        lora: LoraBatch | None = None,
    ) -> torch.Tensor | None:
        """The eager forward in its step's context (engine/worker/forward_context.py: the LoRA batch), then
        the logits of `sample_rows` (None when there are none)."""
        with step_context(lora):
            hidden = self.model(ids, positions, self.kv_caches, meta)
        if not sample_rows:
            return None
        return cast(CausalLM, self.model).compute_logits(  # every registered model has it
            hidden[to_device(sample_rows, torch.int64, hidden.device)]  # no wait for the forward
        )

    # -- swap preemption --------------------------------------------------------------------
    def swap_out(self, request_id: str, block_ids: list[int]) -> int:
        """Copy a request's computed blocks to host memory; returns bytes moved (every tensor-parallel rank
        swaps its own shard: the other ranks are told in the same order as the steps)."""
        if self.peers is not None:
            self.peers.send_control(SWAP_OUT, request_id, block_ids)
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        main = [self.kv_caches[i] for i in self.main_layers]
        saved = [(k[ids].to("cpu", copy=True), v[ids].to("cpu", copy=True)) for k, v in main]
        self._swapped[request_id] = saved
        if self.windows is not None:
            self._swapped_windows[request_id] = self.windows.save(request_id)
        return self._swapped_size(request_id)

    def swap_in(self, request_id: str, block_ids: list[int]) -> int:
        """Copy a swapped request's blocks back into freshly allocated blocks; returns bytes moved."""
        if self.peers is not None:
            self.peers.send_control(SWAP_IN, request_id, block_ids)
        moved = self._swapped_size(request_id)
        saved = self._swapped.pop(request_id)
        ids = torch.tensor(block_ids[: saved[0][0].shape[0]], dtype=torch.long, device=self.device)
        for (k, v), (sk, sv) in zip([self.kv_caches[i] for i in self.main_layers], saved, strict=True):
            k[ids] = sk.to(self.device)
            v[ids] = sv.to(self.device)
        window = self._swapped_windows.pop(request_id, None)
        if self.windows is not None and window is not None:
            self.windows.restore(request_id, *window)
            self._sync_window_caches()
        return moved

    # -- KV hand-off between engines (engine/serving/disagg.py) ----------------------------------------
    def read_blocks(self, block_ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Host copies of K and V of these blocks in every block-pool layer: what a prefill engine ships."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        main = [self.kv_caches[i] for i in self.main_layers]
        return [(k.index_select(0, ids).cpu(), v.index_select(0, ids).cpu()) for k, v in main]

    def stage_blocks(self, request_id: str, blocks: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Blocks that came from a prefill engine wait as a swapped-out copy; admission swaps them in."""
        self._swapped[request_id] = blocks

    def forget(self, request_id: str) -> None:
        """A request ended: free its block-table row and any swapped copy."""
        self.block_rows.forget(request_id)
        self.drop_swapped(request_id)
        self._swapped_windows.pop(request_id, None)
        if self.windows is not None:
            self.windows.release(request_id)

    def drop_swapped(self, request_id: str) -> None:
        """Forget a swapped copy whose request ended while swapped out."""
        if self._swapped.pop(request_id, None) is not None and self.peers is not None:
            self.peers.send_control(DROP_SWAPPED, request_id)
        self._swapped_windows.pop(request_id, None)

    def swapped_bytes(self) -> int:
        """Host bytes currently holding swapped blocks."""
        return sum(self._swapped_size(request_id) for request_id in self._swapped)

    def _swapped_size(self, request_id: str) -> int:
        window = self._swapped_windows.get(request_id)
        copies = self._swapped.get(request_id, []) + (window[1] if window else [])
        return sum(k.numel() * k.element_size() * 2 for k, _ in copies)


def has_window_pool(model: nn.Module, num_layers: int) -> bool:
    """Whether the model's sliding layers get a window pool of their own (when prefix caching is off)."""
    return bool(_mixed_window_layers(model, num_layers)[0])


def _mixed_window_layers(model: nn.Module, num_layers: int) -> tuple[list[int], int]:
    """The sliding-window layers of a model that also has full-attention ones, and their window (else none:
    a model whose every layer slides keeps them all in the BlockPool)."""
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        return [], 0
    sliding = [i for i in range(num_layers) if config.window(i) is not None]
    if not 0 < len(sliding) < num_layers or config.sliding_window is None:
        return [], 0
    return sliding, config.sliding_window


def _raise(exc: Exception) -> None:
    raise exc
