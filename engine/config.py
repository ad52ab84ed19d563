"""EngineConfig: every engine knob as one pydantic model, validated where it is built and when it changes.

Each field is one knob of `fairserve serve`: the settings tree (gateway/settings.py) gives it a CLI flag,
a `FAIRSERVE_ENGINE__*` environment variable and a key in the `[engine]` table of a `--config` TOML file,
and the field's description is the flag's help. Add a knob here and it appears in all three.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.core.limits import RequestCaps
from engine.worker.grammar.config import GrammarConfig
from fairness.config import FairnessConfig
from fairness.registry import policy_entry

# The share of memory the KV cache may take when num_kv_blocks is not given, by device type. On CUDA the
# engine owns the accelerator, so it takes most of what is free after the weights (vLLM's
# gpu_memory_utilization default is 0.9); on a CPU it shares RAM with everything else on the host.
KV_CACHE_FRACTION_BY_DEVICE = {"cuda": 0.9, "cpu": 0.05}
# A CUDA engine's step budget when none is given (a CPU's is the field's default, 256).
CUDA_MAX_NUM_BATCHED_TOKENS = 512


def budget_by_device(data: Any) -> Any:
    """EngineConfig's raw input with a CUDA engine's step budget defaulted to 512 tokens where none is given
    (a CPU's is the field's default, 256; docs/engine.md, "The step's cost")."""
    unset = isinstance(data, dict) and data.get("max_num_batched_tokens") is None
    if unset and str(data.get("device", "cpu")).startswith("cuda"):
        return {**data, "max_num_batched_tokens": CUDA_MAX_NUM_BATCHED_TOKENS}
    return data


class EngineConfig(BaseModel):
    """Budgets, cache geometry, device and model choice for one engine."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(
        default=None, description="Hugging Face model directory (default: the embedded model)"
    )
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="the name clients send as `model` (default: the model directory's name)",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        default="auto",
        description="weight and activation dtype (auto: the checkpoint's, float16 read as float32 on CPU)",
    )
    device: str = Field(default="cpu", description="cpu, cuda or cuda:N")
    attention_backend: Literal["auto", "torch", "triton"] = Field(
        default="auto", description="auto picks the Triton kernels on CUDA and their torch twins on CPU"
    )
    # CUDA graphs for decode steps (engine/worker/decode_graphs.py, docs/engine.md "CUDA graphs").
    # Tensor parallelism (engine/worker/parallel/, docs/engine.md "Tensor parallelism").
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description="ranks one engine's model is split over: one process per GPU (NCCL), or per CPU "
        "process (gloo); rank 0 schedules",
    )
    enforce_eager: bool = Field(
        default=False,
        description="run every step eagerly: no CUDA graphs for decode steps (and no padded static "
        "inputs, which a CPU runs in their place)",
    )
    # By device kind (`_budget_by_device`): on a CPU a 512-token step of cached prompts took about 50 ms
    # beside which another tenant's one-step request waited ×3.1-3.4 of what it waited beside one such loop;
    # at 256, ×1.9, and every flood's neighbour answered in half the time (docs/engine.md, "The step's cost").
    max_num_batched_tokens: int = Field(
        default=256,
        ge=1,
        description="token budget of one iteration (default by device kind: 256 on cpu, 512 on cuda)",
    )
    max_num_seqs: int = Field(default=64, ge=1, description="sequences running at once (seats)")
    # The step cost model (engine/core/step_cost.py, docs/engine.md "The step's cost"): a chunk costs
    # length·(1 + context·cached positions) + sequence new-token equivalents, in the step's budget and in
    # the fair-share charge alike. None: the default for the device kind (engine/core/step_cost.py DEVICE_DEFAULTS).
    step_cost_context: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="new-token equivalents one new token costs per cached position it attends over "
        "(default: the model's attention/linear FLOP ratio × the device kind's factor)",
    )
    step_cost_sequence: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="new-token equivalents every sequence in a step costs (default: by device kind)",
    )
    step_cost_charge: bool = Field(
        default=True,
        description="charge a chunk's cost beyond its new tokens (cached context, per sequence) as service",
    )
    # LoRA adapters (engine/worker/lora/, docs/engine.md "LoRA adapters"): none by default, and then nothing changes.
    lora: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters served over the model, NAME=PATH (a PEFT directory); a request selects "
        "one with `model: NAME`",
    )
    max_lora_rank: int = Field(default=64, ge=1, le=1024, description="the largest LoRA rank loaded")
    # The adapter caches (engine/worker/lora/cache.py, engine/worker/lora/host_cache.py): LRU, adapters in use kept.
    max_loras: int = Field(
        default=8, ge=1, le=1024, description="LoRA adapters held on the device at once (slots)"
    )
    max_cpu_loras: int = Field(
        default=32,
        ge=1,
        le=65536,
        description="LoRA adapters held in host memory at once, loads under way included (>= max_loras)",
    )
    lora_load_bytes_per_token: int = Field(
        default=65536,
        ge=1,
        description="an adapter load is charged one prefill token per this many bytes of its weights file, "
        "to the tenant whose request caused it",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="context length cap (default: the model's)"
    )
    block_size: int = Field(default=16, ge=1, description="tokens per KV-cache block (a power of two)")
    num_kv_blocks: int | None = Field(
        default=None, ge=1, description="KV-cache blocks (default: sized from kv_cache_memory_fraction)"
    )
    kv_cache_memory_fraction: float | None = Field(
        default=None,
        gt=0,
        le=0.95,
        description="share of memory for the KV cache when num_kv_blocks is unset "
        "(default by device: 0.9 of free GPU memory on CUDA, 0.05 of RAM on CPU)",
    )
    enable_prefix_caching: bool = Field(default=True, description="reuse KV blocks of shared prompt prefixes")
    watermark_blocks: int = Field(
        default=0, ge=0, description="free blocks admission keeps for running decodes"
    )
    preemption_mode: Literal["recompute", "swap"] = Field(
        default="recompute", description="what preemption does with a victim's KV blocks"
    )
    swap_space_bytes: int = Field(
        default=256 * 2**20, ge=0, description="host memory for swapped-out KV blocks"
    )
    fairness: FairnessConfig = Field(default_factory=FairnessConfig)
    trace_path: str | None = Field(
        default=None, description="write one IterationTrace JSON line per iteration"
    )
    seed: int = Field(default=0, description="sampling seed")
    cache_dir: str | None = Field(default=None, description="where the embedded default model is built")
    # "forkserver": a server process imports the engine (torch) once and every worker, the first and each
    # replacement, is forked from it, so replacing a dead worker skips the interpreter start and the imports
    # (docs/engine.md, "Kill to ready"). "spawn": a fresh interpreter each time.
    worker_start_method: Literal["forkserver", "spawn"] = Field(
        default="forkserver", description="how the process engine starts its worker"
    )
    caps: RequestCaps = Field(default_factory=RequestCaps)
    grammar: GrammarConfig = Field(
        default_factory=GrammarConfig
    )  # constrained decoding (engine/worker/grammar/)
    # Async scheduling (engine/core/async_scheduler.py, engine/worker/overlap.py). auto: on for CUDA, where the forward runs on the device and
    # the host work beside it is free; off on CPU, where the forward needs the same cores and the GIL
    # (measured: docs/engine.md, "Overlap").
    async_scheduling: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="schedule step N+1 while step N's forward runs (auto: on for CUDA, off on CPU)",
    )
    # One fair share across engines (engine/serving/counter_sync.py, docs/fairness.md "Across engines"). Off by default:
    # a lone engine has nobody to share with. `fairserve serve` does not pass the gateway's --redis along
    # either: the engine it spawns is alone unless asked (--engine-redis).
    redis_url: str | None = Field(
        default=None,
        description="redis:// URL where engines share VTC counters, so tenants get one fair "
        "share across every engine using it (default: off, counters local)",
    )
    counter_sync_interval_s: float = Field(
        default=0.1,
        gt=0,
        le=1.0,
        allow_inf_nan=False,
        description="seconds between publishing this engine's charged service and reading the others'",
    )
    counter_sync_prefix: str = Field(
        default="fairserve:vtc",
        min_length=1,
        pattern=r"^[^\s]+$",
        description="Redis key prefix of the shared counters: engines with the same prefix share one fair share",
    )
    # OpenTelemetry traces (engine/serving/tracing.py, gateway/ops/tracing.py): gateway and engine export their own
    # spans to the same collector, so both read these (`serve` and `fairserve engine` alike).
    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector for traces (http://HOST:4318, or its /v1/traces URL); default: "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT; none set: tracing off",
    )
    trace_sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="share of requests the gateway traces (a caller's sampled traceparent is always followed)",
    )

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("block_size must be a power of two")
        return value

    @field_validator("model")
    @classmethod
    def _model_dir(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_dir():
            raise ValueError(
                f"model {value!r} is not a directory (a Hugging Face model directory with "
                "config.json, *.safetensors and tokenizer.json)"
            )
        return value

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_pairs(cls, value: object) -> object:
        """`--lora NAME=PATH`, repeated, arrives as a list of NAME=PATH strings; a TOML table or a dict as is."""
        if not isinstance(value, list):
            return value
        pairs: dict[str, str] = {}
        for item in value:
            name, sep, path = str(item).partition("=")
            if not sep or not name or not path:
                raise ValueError(f"lora {item!r}: use NAME=PATH (a PEFT adapter directory)")
            if name in pairs:
                raise ValueError(f"lora: adapter {name!r} named twice")
            pairs[name] = path
        return pairs

    @field_validator("lora")
    @classmethod
    def _lora_dirs(cls, value: dict[str, str]) -> dict[str, str]:
        """Every adapter a PEFT directory, checked at start as `model` is and as the admin API checks a
        registered one: a typo is exit 2 now, not an adapter listed in /v1/models that fails every request."""
        for name, path in value.items():
            if not (Path(path).expanduser() / "adapter_config.json").is_file():
                raise ValueError(
                    f"lora {name}={path}: not a PEFT adapter directory (no adapter_config.json in it)"
                )
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url {value!r}: use redis://HOST:PORT/DB, rediss://... or unix://PATH")
        return value

    @model_validator(mode="before")
    @classmethod
    def _budget_by_device(cls, data: Any) -> Any:
        return budget_by_device(data)

    @model_validator(mode="after")
    def _shared_policy(self) -> EngineConfig:
        if self.redis_url is not None and not policy_entry(self.fairness.policy).shares_counters:
            raise ValueError(
                f"redis_url shares fairness counters across engines, and policy "
                f"{self.fairness.policy!r} keeps none: use a policy that does (vtc) or drop redis_url"
            )
        return self

    @model_validator(mode="after")
    def _lora_caches(self) -> EngineConfig:
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}): every "
                "adapter on the device is loaded through host memory"
            )
        return self

    @model_validator(mode="after")
    def _lora_single_rank(self) -> EngineConfig:
        if self.lora and self.tensor_parallel_size > 1:
            raise ValueError("LoRA adapters (lora) are not served with tensor_parallel_size > 1 yet")
        return self

    @model_validator(mode="after")
    def _device_available(self) -> EngineConfig:
        """A CUDA device must exist: say so when the settings are built, not when the worker starts.

        Only device counting, which creates no CUDA context: the gateway process validates this config and
        a context there would hold GPU memory the engine worker's KV cache is sized from.
        """
        kind, _, index = self.device.partition(":")
        if kind not in KV_CACHE_FRACTION_BY_DEVICE or (index and (kind != "cuda" or not index.isdigit())):
            raise ValueError(f"device {self.device!r}: use cpu, cuda or cuda:N")
        if kind == "cuda":
            import torch  # deferred: only a CUDA request needs to ask the driver

            if not torch.cuda.is_available():
                raise ValueError(
                    f"device {self.device!r} asked for, but CUDA is not available here "
                    "(torch.cuda.is_available() is False); use --device cpu"
                )
            if int(index or 0) + self.tensor_parallel_size > torch.cuda.device_count():
                raise ValueError(
                    f"device {self.device!r} with tensor_parallel_size {self.tensor_parallel_size}: "
                    f"only {torch.cuda.device_count()} CUDA device(s) here"
                )
        return self

    def overlaps(self) -> bool:
        """Whether the engine schedules the next step while a forward runs (`async_scheduling` resolved)."""
        if self.async_scheduling == "auto":
            return self.device.startswith("cuda")
        return self.async_scheduling == "on"

    def kv_fraction(self) -> float:
        """The KV cache's share of memory: the configured one, else the device's default."""
        if self.kv_cache_memory_fraction is not None:
            return self.kv_cache_memory_fraction
        return KV_CACHE_FRACTION_BY_DEVICE[self.device.partition(":")[0]]
