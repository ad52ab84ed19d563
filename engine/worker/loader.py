"""Load a Hugging Face model directory (config, safetensors, tokenizer), or build the embedded default.

The embedded default is a small seeded Llama with a byte-level tokenizer, written with plain torch
and safetensors into a cache directory on first use, so nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from engine.core.byte_tokenizer import BYTE_SPECIAL_TOKENS, byte_tokenizer_config, write_byte_tokenizer
from engine.core.tokenizer import Tokenizer, read_json
from engine.worker.layers import SourceSlice
from engine.worker.model_config import eos_ids
from engine.worker.models import ModelConfig, build_model
from engine.worker.models.protocol import CausalLM
from engine.worker.parallel.group import TPGroup
from engine.worker.rank_steps import StepPeers

if TYPE_CHECKING:
    from engine.config import EngineConfig

DEFAULT_MODEL_NAME = "fairserve-tiny"
DEFAULT_MODEL_VERSION = (
    "fairserve-tiny-v3"  # bump when the default model's files change (v3: tools in its template)
)
DEFAULT_MODEL_SEED = 1234
_READABLE_BYTES = [10, *range(32, 127)]
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Files whose presence means a default model directory is complete (written last: the weights).
_DEFAULT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
)


@dataclass
class LoadedModel:
    """A model ready to run: module with weights, its config and tokenizer, and where it came from."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    path: Path
    dtype: torch.dtype
    name: str  # the served model name


def load_model(
    path: str | Path | None,
    *,
    dtype: str,
    device: str,
    cache_dir: str | None = None,
    tp: TPGroup | None = None,
) -> LoadedModel:
    """Load the model directory at path (None: the embedded default, built on first use).

    tp: this rank's tensor-parallel group; the rank builds its shard of the model and reads only that
    shard of each checkpoint tensor from the safetensors files.
    """
    root = default_model_dir(cache_dir) if path is None else Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {str(root)!r} does not exist")
    config_file = root / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{root}: no config.json; expected a Hugging Face model directory")
    try:
        hf_config: dict[str, Any] = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: invalid JSON ({exc})") from exc
    cfg = ModelConfig.from_hf_config(hf_config)
    generation = read_json(root / "generation_config.json")
    if generation.get("eos_token_id") is not None:
        cfg.eos_token_ids = eos_ids(generation["eos_token_id"])
    weight_files = safetensors_files(root)
    tokenizer = Tokenizer.from_dir(root)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"{root}: tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size}"
        )
    torch_dtype = resolve_dtype(dtype, hf_config, device)
    model = build_model(cfg, torch_dtype, torch.device(device), tp)
    causal = cast(CausalLM, model)  # every registered model has these
    slices = None
    if tp is not None:
        slices = {name: t.source for name, t in causal.weight_targets().items() if t.source is not None}
    causal.load_weights(iter_tensors(weight_files, slices))
    name = DEFAULT_MODEL_NAME if path is None else root.resolve().name
    return LoadedModel(model=model, config=cfg, tokenizer=tokenizer, path=root, dtype=torch_dtype, name=name)


def resolve_dtype(dtype: str, hf_config: dict[str, Any], device: str) -> torch.dtype:
    """`auto` is the checkpoint's dtype, except float16 becomes float32 on CPU (slow/unsupported matmuls)."""
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be auto, {', '.join(_DTYPES)}; got {dtype!r}")
        return _DTYPES[dtype]
    declared = hf_config.get("dtype") or hf_config.get("torch_dtype") or "float32"
    resolved = _DTYPES.get(str(declared), torch.float32)
    if resolved is torch.float16 and torch.device(device).type == "cpu":
        return torch.float32
    return resolved


def safetensors_files(root: Path) -> list[Path]:
    """The checkpoint shards: those of model.safetensors.index.json, else every *.safetensors file."""
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: missing or empty 'weight_map'")
        files = [root / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{root}: shards named in {index.name} are missing: {', '.join(absent)}")
        return files
    files = sorted(root.glob("*.safetensors"))
    if not files:
        other = [p.name for p in root.glob("*.bin")] + [p.name for p in root.glob("*.pt")]
        hint = f" (found {', '.join(other)}: convert to safetensors)" if other else ""
        raise FileNotFoundError(f"{root}: no *.safetensors weights{hint}")
    return files


def iter_tensors(
    files: list[Path], slices: Mapping[str, SourceSlice] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every checkpoint tensor in the shards, one at a time; a tensor named in `slices`
    is read only in that part (a tensor-parallel rank's shard: the rest is never read from the file)."""
    # One tensor at a time, so peak memory stays near the model size rather than twice it.
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                source = slices.get(name) if slices else None
                if source is None:
                    yield name, f.get_tensor(name)
                    continue
                cut = slice(source.start, source.start + source.length)
                yield name, f.get_slice(name)[(slice(None),) * source.dim + (cut,)]


def default_model_dir(cache_dir: str | None = None) -> Path:
    """The embedded default model's directory, built atomically on first use."""
    root = Path(cache_dir or os.environ.get("FAIRSERVE_CACHE") or Path.home() / ".cache" / "fairserve")
    target = root / "models" / DEFAULT_MODEL_VERSION
    if all((target / f).is_file() for f in _DEFAULT_FILES):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builders each finish a complete copy and the
    # first rename wins; the others find the target in place and discard theirs.
    staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_VERSION}-", dir=target.parent))
    try:
        write_default_model(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            staging.rename(target)
        except OSError:
            if not all((target / f).is_file() for f in _DEFAULT_FILES):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_model_config(vocab_size: int) -> dict[str, Any]:
    """The HF LlamaConfig-compatible config.json of the embedded default model."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 256,
        "eos_token_id": 257,
        "pad_token_id": 258,
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
    }


def write_default_model(path: str | Path) -> None:
    """Write the seeded tiny Llama (config, generation config, weights, byte tokenizer) into path."""
    write_seeded_llama(path, default_model_config(256 + len(BYTE_SPECIAL_TOKENS)))


def write_seeded_llama(path: str | Path, hf_config: dict[str, Any]) -> None:
    """Write a seeded random Llama of any geometry with the byte tokenizer (the default model's recipe;
    experiments/host_overhead.py uses it for a model small enough that the forward does not hide the host)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(root / "tokenizer.json")
    (root / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    generation = {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258, "do_sample": False}
    (root / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (root / "tokenizer_config.json").write_text(json.dumps(byte_tokenizer_config(), indent=2) + "\n")
    save_file(_default_weights(hf_config), str(root / "model.safetensors"), metadata={"format": "pt"})


def _default_weights(c: dict[str, Any]) -> dict[str, torch.Tensor]:
    # A private generator keeps the weights fixed without touching the caller's global RNG.
    gen = torch.Generator().manual_seed(DEFAULT_MODEL_SEED)
    std = float(c["initializer_range"])
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q_size = c["num_attention_heads"] * c["head_dim"]
    kv_size = c["num_key_value_heads"] * c["head_dim"]

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    weights = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(q_size, hidden),
            p + "self_attn.k_proj.weight": normal(kv_size, hidden),
            p + "self_attn.v_proj.weight": normal(kv_size, hidden),
            p + "self_attn.o_proj.weight": normal(hidden, q_size),
            p + "mlp.gate_proj.weight": normal(inter, hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    weights["model.norm.weight"] = torch.ones(hidden)
    # Larger head rows for printable ASCII and newline make the random model mostly emit readable
    # text (handy for demos and stop strings) instead of invalid UTF-8 bytes.
    head = normal(vocab, hidden)
    head[_READABLE_BYTES] *= 8.0
    weights["lm_head.weight"] = head
    return weights


def load_ranks(config: EngineConfig, loaded: LoadedModel | None) -> tuple[StepPeers | None, LoadedModel]:
    """The other tensor-parallel ranks (None on one rank) and this rank's model."""
    if config.tensor_parallel_size == 1:
        return None, loaded or load_model(
            config.model, dtype=config.dtype, device=config.device, cache_dir=config.cache_dir
        )
    if loaded is not None:
        raise ValueError("a preloaded model cannot be tensor-parallel: each rank loads its own shard")
    peers = StepPeers.start(config)
    try:
        shard = load_model(
            config.model, dtype=config.dtype, device=config.device, cache_dir=config.cache_dir, tp=peers.group
        )
    except BaseException:
        peers.close()
        raise
    return peers, shard
