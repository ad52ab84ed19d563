"""Engine configuration: one typed object, validated where it is built."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.limits import RequestCaps


@dataclass
class FairnessSettings:
    """Which fairness policy orders the waiting queue, and its knobs (see fairness/)."""

    policy: str = "vtc"  # vtc | fcfs: fair share is the default
    key: str = "tenant"  # tenant | api_key | user
    w_in: float = 1.0
    w_out: float = 2.0
    w_cached: float = 0.0
    priority_classes: bool = True
    max_queue_age_s: float = 30.0
    edf: bool = False
    lift_allowance: float = 1024.0  # service units a returning key may trail the backlogged minimum by


@dataclass
class EngineConfig:
    """Budgets, cache geometry and model choice for one engine."""

    model: str | None = None  # a Hugging Face model directory; None builds the embedded default
    dtype: str = "auto"  # auto | float32 | float16 | bfloat16
    device: str = "cpu"
    attention_backend: str = "auto"  # auto | torch | triton
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_model_len: int | None = None  # defaults to the model's context
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: sized from kv_cache_memory_fraction
    kv_cache_memory_fraction: float = 0.05
    enable_prefix_caching: bool = True
    watermark_blocks: int = 0  # free blocks admission keeps in reserve for running decodes
    preemption_mode: str = "recompute"  # recompute | swap
    swap_space_bytes: int = 256 * 2**20
    fairness: FairnessSettings = field(default_factory=FairnessSettings)
    trace_path: str | None = None  # write one IterationTrace JSON line per iteration
    seed: int = 0
    cache_dir: str | None = None  # where the embedded default model is built
    # Run ProcessEngine's worker under SCHED_BATCH (Linux): woken by a Submit, it waits for the writer to
    # yield its CPU instead of preempting it mid-write. Off by default: on the 2-core VM it cut how long a
    # submit holds the loop at 20 req/s but cost the gateway a little at 200 (docs/gateway.md, submit_wake).
    worker_batch_scheduling: bool = False
    # How ProcessEngine starts its worker. "forkserver": a server process imports the engine (torch) once and
    # every worker, the first and each replacement, is forked from it, so replacing a dead worker skips the
    # interpreter start and the imports (docs/engine.md, "Kill to ready"). "spawn": a fresh interpreter each time.
    worker_start_method: str = "forkserver"
    # Per-request host-work caps (stop strings, logit_bias, stop token ids, prompt bytes): engine/limits.py.
    caps: RequestCaps = field(default_factory=RequestCaps)
    # ProcessEngine's worker pickles and writes each step's report on a thread of its own, overlapping the
    # next step (engine/publisher.py). Off by default until measured to help: see docs/engine.md.
    overlap_publish: bool = False

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if not 0 < self.kv_cache_memory_fraction <= 0.95:
            raise ValueError("kv_cache_memory_fraction must be in (0, 0.95]")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError("preemption_mode must be recompute or swap")
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ValueError("dtype must be auto, float32, float16 or bfloat16")
        if self.worker_start_method not in ("forkserver", "spawn"):
            raise ValueError("worker_start_method must be forkserver or spawn")
        if self.watermark_blocks < 0:
            raise ValueError("watermark_blocks must be >= 0")
