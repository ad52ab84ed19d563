"""Turns a SchedulerOutput into one flat forward pass over a mixed prefill/decode batch, then samples."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import AttentionMetadata, KVCache
from engine.request import Request
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput


def kv_block_bytes(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Bytes one block occupies across all layers, K and V."""
    return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


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
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = device
        self.backend = backend
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_caches: list[KVCache] = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]
        self.sampler = Sampler(seed)
        self._swapped: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def prepare(self, out: SchedulerOutput, block_tables: dict[str, list[int]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, list[int]]:
        """Flatten the batch: token ids, positions, attention metadata, and the rows whose logits are sampled."""
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        bs = self.block_size
        max_blocks = 1
        for chunk in out.chunks:
            request = chunk.request
            table = block_tables[request.request_id]
            max_blocks = max(max_blocks, len(table))
            all_ids = request.all_token_ids
            end = chunk.start + chunk.length
            token_ids.extend(all_ids[chunk.start : end])
            for pos in range(chunk.start, end):
                positions.append(pos)
                slots.append(table[pos // bs] * bs + pos % bs)
            starts.append(starts[-1] + chunk.length)
            seq_lens.append(end)
            if chunk.samples:
                sample_rows.append(starts[-1] - 1)
        tables = torch.zeros((len(out.chunks), max_blocks), dtype=torch.int32)
        for i, chunk in enumerate(out.chunks):
            table = block_tables[chunk.request.request_id]
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=tables.to(dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            max_query_len=max((c.length for c in out.chunks), default=0),
            max_seq_len=max(seq_lens, default=0),
            backend=self.backend,
        )
        ids = torch.tensor(token_ids, dtype=torch.int64, device=dev)
        pos_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos_t, meta, sample_rows

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, block_tables: dict[str, list[int]]) -> dict[str, int]:
        """Run the model once on the batch; return the sampled token of every request whose chunk completes."""
        if not out.chunks:
            return {}
        ids, positions, meta, sample_rows = self.prepare(out, block_tables)
        hidden = self.model(ids, positions, self.kv_caches, meta)
        sampling = [c.request for c in out.chunks if c.samples]
        if not sampling:
            return {}
        logits = self.model.compute_logits(  # type: ignore[operator]
            hidden[torch.tensor(sample_rows, device=hidden.device)])
        tokens = self.sampler.sample(logits, sampling)
        return {r.request_id: t for r, t in zip(sampling, tokens, strict=True)}

    # -- swap preemption --------------------------------------------------------------------
    def swap_out(self, request: Request, block_ids: list[int]) -> int:
        """Copy a request's computed blocks to host memory; returns bytes moved."""
        ids = torch.tensor(block_ids, dtype=torch.long, device=self.device)
        saved = [(k[ids].to("cpu", copy=True), v[ids].to("cpu", copy=True)) for k, v in self.kv_caches]
        self._swapped[request.request_id] = saved
        return sum(k.numel() * k.element_size() * 2 for k, _ in saved)

    def swap_in(self, request: Request, block_ids: list[int]) -> int:
        """Copy a swapped request's blocks back into freshly allocated blocks; returns bytes moved."""
        saved = self._swapped.pop(request.request_id)
        ids = torch.tensor(block_ids[: saved[0][0].shape[0]], dtype=torch.long, device=self.device)
        for (k, v), (sk, sv) in zip(self.kv_caches, saved, strict=True):
            k[ids] = sk.to(self.device)
            v[ids] = sv.to(self.device)
        return sum(k.numel() * k.element_size() * 2 for k, _ in saved)

    def drop_swapped(self, request_id: str) -> None:
        """Forget a swapped copy whose request ended while swapped out."""
        self._swapped.pop(request_id, None)

    def swapped_bytes(self) -> int:
        """Host bytes currently holding swapped blocks."""
        return sum(k.numel() * k.element_size() * 2 for saved in self._swapped.values() for k, _ in saved)
