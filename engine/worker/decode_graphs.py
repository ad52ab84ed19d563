"""CUDA graphs for decode steps: one captured forward per padded batch size, replayed over static inputs.

A decode step (every scheduled request has exactly one query token) launches a few hundred small
kernels whose launch cost, not the GPU, sets the step time. So at start the engine captures the
forward, from token ids to logits, once per batch-size bucket (`graph_batch_sizes`: 1, 2, 4, then every
multiple of 8 up to max_num_seqs, as vLLM's capture sizes) into a `torch.cuda.CUDAGraph`, largest first,
all sharing one memory pool (nano-vllm's capture_cudagraph). A decode step of n requests copies its
inputs into persistent buffers sized for the largest bucket (`DecodeInputs`), pads them to the
smallest bucket >= n with rows that store nowhere (slot -1) and attend to nothing (seq_len 0), replays that
bucket's graph and reads the logits of its own rows; the padding rows' logits are never read.
Sampling stays outside the graph. Steps with a prefill chunk run eagerly.

The buffer code is one path on every device: on CPU the "capture" (`capture_eager`) keeps the forward
over the static buffers as it is, so CPU tests run the bucketing, padding and buffer reuse and only
the capture itself needs a GPU. The Triton attention takes the batch's longest context from the host to
choose its split count, which a graph fixes at capture; so each batch bucket is captured once per range of
contexts with one split count (`split_context_bounds`), and a step replays the graph of its live longest
context (the host knows it): the launches eager would make, with no empty splits and, at short context,
no reduce.
"""

from __future__ import annotations

import bisect
import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from engine.worker.attention import AttentionMetadata, KVCache
from engine.worker.decode_inputs import DecodeInputs
from engine.worker.models.protocol import CausalLM
from engine.worker.sampler import to_device
from fairserve_kernels.launch_heuristics import num_sms, split_context_bounds

if TYPE_CHECKING:
    from engine.worker.host_batch import HostBatch

log = logging.getLogger(__name__)

# ids, positions, KV caches, metadata -> logits of every row (the model's forward and LM head), float32 or the
# model dtype: a graph copies them into its float32 buffer.
Forward = Callable[[torch.Tensor, torch.Tensor, list[KVCache], AttentionMetadata], torch.Tensor]
Replay = Callable[[], None]
Capture = Callable[[Replay], Replay]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, every multiple of 8 below max_num_seqs, and max_num_seqs: a decode batch pads to the
    next of these, wasting at most 7 rows once past 8 (vLLM's capture sizes, cut at the seat count)."""
    small = [size for size in (1, 2, 4) if size < max_num_seqs]
    return small + list(range(8, max_num_seqs, 8)) + [max_num_seqs]


def batch_sizes(max_num_seqs: int, device: torch.device) -> list[int]:
    """The buckets of a device: `graph_batch_sizes` on CUDA; on CPU, where nothing is captured and a padding
    row costs what a real one does (9 decodes padded to 16 took 1.46x the eager time), every size."""
    if device.type == "cuda":
        return graph_batch_sizes(max_num_seqs)
    return list(range(1, max_num_seqs + 1))


def uses_graphs(enforce_eager: bool, device: torch.device, backend: str) -> bool:
    """Whether decode steps go through `DecodeGraphs`: unless told to run eagerly, on CPU (no capture,
    the same buffers) and on CUDA with the Triton kernels (their torch twins read lengths on the host,
    which a capture cannot)."""
    return not enforce_eager and (device.type != "cuda" or backend == "triton")


def capture_eager(run: Replay) -> Replay:
    """No capture (CPU): a replay is the eager forward over the static buffers."""
    return run


class CudaGraphCapture:
    """Captures each bucket's forward into a CUDA graph; all graphs share the first (largest) one's pool."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._first: torch.cuda.CUDAGraph | None = None  # whose memory pool the later captures share

    def __call__(self, run: Replay) -> Replay:
        device = self.device
        with torch.cuda.device(device):  # the capture stream and the pool on the engine's device
            # A warm-up outside the capture: Triton compiles and loads its kernels, cuBLAS its workspace.
            run()
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=None if self._first is None else self._first.pool()):
                run()
        if self._first is None:
            self._first = graph

        def replay() -> None:
            with torch.cuda.device(device):  # the forward thread's current device may be another
                graph.replay()

        return replay


def capture_for(device: torch.device) -> Capture:
    """The capture of this device (a seam: tests make it raise to check the fallback)."""
    return CudaGraphCapture(device) if device.type == "cuda" else capture_eager


class DecodeGraphs:
    """One replay per bucket, over one `DecodeInputs`, bound to the KV cache tensors given at capture."""

    def __init__(
        self,
        forward: Forward,
        kv_caches: Sequence[KVCache],
        inputs: DecodeInputs,
        sizes: Sequence[int],
        max_seq_len: int,
        backend: str,
    ) -> None:
        self.sizes = sorted(sizes)
        self.inputs = inputs
        self.memory_bytes = 0  # what the capture took (set by `GraphPlan.start`)
        self.replayed_steps = 0
        self._forward = forward
        self._kv = list(kv_caches)  # a graph holds these tensors' addresses: new ones need a new capture
        # Per batch bucket, the context bounds each captured with its own split count (one on the twins).
        self.contexts = {
            size: _context_bounds(size, max_seq_len, backend, self._kv, inputs) for size in self.sizes
        }
        self._metas = {
            (size, bound): inputs.meta(size, bound, backend)
            for size in self.sizes
            for bound in self.contexts[size]
        }
        self._replays: dict[tuple[int, int], Replay] = {}

    def capture(self, capture: Capture) -> None:
        """Capture every (bucket, context bound), largest first (the smaller ones then fit in its pool)."""
        with torch.inference_mode():
            for key in sorted(self._metas, reverse=True):
                self._replays[key] = capture(self._bucket_forward(key))

    def _bucket_forward(self, key: tuple[int, int]) -> Replay:
        size = key[0]
        inputs, meta, kv, forward = self.inputs, self._metas[key], self._kv, self._forward

        def run() -> None:
            inputs.logits[:size] = forward(inputs.ids[:size], inputs.positions[:size], kv, meta)

        return run

    def bucket(self, num_seqs: int) -> int | None:
        """The smallest captured size holding `num_seqs` rows (None: more than the largest)."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def bound_to(self, kv_caches: Sequence[KVCache]) -> bool:
        """Whether the runner's KV tensors are still the captured ones (a grown window pool's are not)."""
        return len(kv_caches) == len(self._kv) and all(
            a is b for a, b in zip(kv_caches, self._kv, strict=True)
        )

    def serves(self, batch: HostBatch) -> bool:
        """A decode step (one query token per request) that a bucket holds."""
        rows = batch.seq_lens.shape[0]
        return (
            batch.max_query_len == 1
            and batch.ids.shape[0] == rows
            and self.bucket(rows) is not None
            and self.inputs.fits(batch)
        )

    def run(
        self, batch: HostBatch, ids: torch.Tensor | None = None, prev: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Replay the batch's bucket; the logits of its sample rows (a view, valid until the next replay).
        `ids`/`prev`: see `DecodeInputs.fill`."""
        rows = batch.seq_lens.shape[0]
        size = self.bucket(rows)
        if size is None:
            raise ValueError(f"a decode batch of {rows} rows exceeds the largest graph ({self.sizes[-1]})")
        bounds = self.contexts[size]
        live = int(batch.seq_lens.max())  # a host tensor: no device sync
        bound = bounds[min(bisect.bisect_left(bounds, live), len(bounds) - 1)]
        self.inputs.fill(batch, size, ids, prev)
        self._replays[(size, bound)]()
        self.replayed_steps += 1
        logits = self.inputs.logits
        sample_rows = batch.sample_rows
        # Every row in order is the common case, and a view. As many sample rows as rows is not enough to
        # know it: a forked choice repeats its leader's row while a row still in its prefill samples none.
        if sample_rows == list(range(rows)):
            return logits[:rows]
        return logits[to_device(sample_rows, torch.long, logits.device)]


def _context_bounds(
    size: int, max_seq_len: int, backend: str, kv_caches: Sequence[KVCache], inputs: DecodeInputs
) -> list[int]:
    """The context bounds a bucket of `size` rows is captured at: one per split count the Triton attention
    picks over contexts up to max_seq_len (fairserve_kernels/launch_heuristics.py), from its kv heads and
    the device's SMs as the kernel's wrapper sees them; the torch twins do not split, so one."""
    caches = [k for k, _ in kv_caches if k.dim() == 4]
    if backend != "triton" or not caches:
        return [max_seq_len]
    num_kv_heads = caches[0].shape[2]
    bounds = split_context_bounds(size * num_kv_heads, max_seq_len, num_sms(inputs.ids.device))
    return [bound for bound, _ in bounds]


def logits_forward(model: nn.Module) -> Forward:
    """The model's forward and LM head as one call: what a graph captures (sampling stays outside); its
    logits may be in the model dtype, for the float32 buffer they are copied into."""
    lm = cast(CausalLM, model)  # every registered model has compute_logits
    # The logits before their float32 cast where a model has them: the graph's copy into its float32 buffer
    # casts, so the cast and the copy are one kernel.
    head: Callable[[torch.Tensor], torch.Tensor] = getattr(model, "raw_logits", lm.compute_logits)

    def forward(
        ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[KVCache], meta: AttentionMetadata
    ) -> torch.Tensor:
        return head(model(ids, positions, kv_caches, meta))

    return forward


@dataclass(frozen=True)
class GraphPlan:
    """What the engine captures: the buckets, the context bound and the shape of the static inputs."""

    sizes: list[int]
    max_model_len: int
    block_size: int
    vocab_size: int
    backend: str
    device: torch.device

    def inputs(self, windowed: bool) -> DecodeInputs:
        """Fresh static inputs for the largest bucket, block tables as wide as a max_model_len context."""
        width = -(-self.max_model_len // self.block_size)
        return DecodeInputs(self.sizes[-1], width, self.vocab_size, windowed, self.device)

    def start(self, forward: Forward, kv_caches: Sequence[KVCache], windowed: bool) -> DecodeGraphs | None:
        """Capture every bucket; on failure, one warning line and None (every step then runs eagerly)."""
        device = self.device
        free_before = _free_bytes(device)
        graphs = DecodeGraphs(
            forward, kv_caches, self.inputs(windowed), self.sizes, self.max_model_len, self.backend
        )
        try:
            graphs.capture(capture_for(device))
        except Exception as exc:  # whatever a capture trips on, the eager path needs none of it
            first_line = (str(exc).splitlines() or [""])[0]
            log.warning(
                "decode graph capture failed, every step runs eagerly: %s: %s", type(exc).__name__, first_line
            )
            del graphs
            _release(device)
            return None
        graphs.memory_bytes = (
            free_before - _free_bytes(device) if device.type == "cuda" else _buffer_bytes(graphs.inputs)
        )
        log.info(
            "decode graphs: %d batch sizes up to %d, %d graphs with the context buckets, %.1f MiB",
            len(graphs.sizes),
            graphs.sizes[-1],
            sum(map(len, graphs.contexts.values())),
            graphs.memory_bytes / 2**20,
        )
        return graphs

    def measure(
        self,
        forward: Forward,
        kv_shape: tuple[int, int, int, int],
        dtype: torch.dtype,
        num_layers: int,
        windowed: bool,
        probe: bool = True,
    ) -> int:
        """Bytes the graphs will hold, taken before the KV cache is sized from what is left.

        CUDA: the largest bucket is captured over a throwaway two-block cache and the drop in free device
        memory is taken (its pool, the static inputs, the warm-up's cached activations, first-use kernel
        modules); the smaller buckets reuse that pool. All of it is released before the KV cache is
        allocated. CPU: the static inputs' bytes. A capture that fails here counts 0 (the real one fails
        the same way and says so). Without `probe` (tensor parallelism: a capture runs collectives), also
        the static inputs' bytes.
        """
        device = self.device
        if device.type != "cuda" or not probe:
            return _buffer_bytes(self.inputs(windowed))
        k, v = (torch.zeros((2, *kv_shape[1:]), dtype=dtype, device=device) for _ in range(2))
        free_before = _free_bytes(device)
        try:
            largest = DecodeGraphs(
                forward,
                [(k, v)] * num_layers,
                self.inputs(windowed),
                self.sizes[-1:],
                self.max_model_len,
                self.backend,
            )
            largest.capture(capture_for(device))
            taken = free_before - _free_bytes(device)
            del largest
        except Exception:
            taken = 0
        _release(device)
        return max(taken, 0)


def _buffer_bytes(inputs: DecodeInputs) -> int:
    tensors = [
        inputs.ids,
        inputs.positions,
        inputs.slots,
        inputs.seq_lens,
        inputs.query_start_loc,
        inputs.table,
        inputs.logits,
    ]
    tensors += [t for t in (inputs.window_slots, inputs.window_table) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)


def _free_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    return int(torch.cuda.mem_get_info(device)[0])


def _release(device: torch.device) -> None:
    """Return what a dropped capture held to the device."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
