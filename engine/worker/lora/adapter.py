"""One LoRA adapter read from a PEFT directory: adapter_config.json and adapter_model.safetensors.

Read with json and safetensors directly, so the engine does not depend on peft. Every way a directory
can be wrong (missing files, an unsupported option, a module the model lacks or this engine does not adapt,
`embed_tokens` and `lm_head` named as such, a rank over the limit, a scale or a weight that is not finite in
the model's dtype, a mis-shaped tensor) is an `AdapterError` naming the adapter: the host cache remembers it
(engine/worker/lora/host_cache.py), and only requests that name that adapter fail with it. `check_directory` runs
the checks that need no model (the admin API's, at registration); `load_adapter` runs them all again.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.worker.model_config import ModelConfig

# The projections an adapter may target, by the HF module name (q/k/v and gate/up are fused in our layers).
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_MODULES + MLP_MODULES
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)


# Modules PEFT may target that this engine does not adapt, refused by name (an adapter of them would be
# served as if they were not there, i.e. wrongly).
UNSERVED_MODULES = ("embed_tokens", "lm_head")
# The largest |alpha / r| served: the scale multiplies every adapted row's delta in float32 on the device,
# and no trained adapter scales its delta this far; a larger one only overflows (issue 54: 1e308).
MAX_SCALE = 1e4


class AdapterError(ValueError):
    """An adapter directory the engine cannot serve; the message names the adapter."""


@dataclass
class LoraAdapter:
    """An adapter's weights, keyed (layer, HF module name) -> (A [r, d_in], B [d_out, r]), and its scale."""

    name: str
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    service_scale: float = (
        1.0  # each token's service multiplier (engine/worker/lora/cost.py), set when loaded
    )
    load_bytes: int = (
        0  # bytes of adapter_model.safetensors read: its load charge (engine/worker/lora/intake.py)
    )

    @property
    def modules(self) -> set[str]:
        """The HF module names it targets (the fairness charge counts their sizes)."""
        return {module for _, module in self.weights}


def module_shape(cfg: ModelConfig, module: str) -> tuple[int, int]:
    """(d_in, d_out) of one targeted projection in the base model."""
    q, kv, hidden, inter = (
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.hidden_size,
        cfg.intermediate_size,
    )
    shapes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    return shapes[module]


def read_config(name: str, path: Path) -> tuple[int, float]:
    """(rank, scale) from adapter_config.json, refusing the options this slice does not serve."""
    file = path / "adapter_config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"adapter {name!r}: cannot read {file}: {exc}") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"adapter {name!r}: {file} is not a JSON object")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"adapter {name!r}: adapter_config.json `r` must be a positive integer")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(f"adapter {name!r}: adapter_config.json `lora_alpha` must be a number")
    for option, off in (("use_dora", False), ("bias", "none"), ("modules_to_save", None)):
        if config.get(option, off) not in (off, [], {}):
            raise AdapterError(f"adapter {name!r}: `{option}` is not served (only plain LoRA is)")
    for option in ("rank_pattern", "alpha_pattern"):
        if config.get(option):
            raise AdapterError(f"adapter {name!r}: per-module `{option}` is not served")
    _check_targets(name, config.get("target_modules"))
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    if not math.isfinite(scale) or abs(scale) > MAX_SCALE:
        raise AdapterError(f"adapter {name!r}: its scale lora_alpha / r is {scale:g}, beyond ±{MAX_SCALE:g}")
    return rank, float(scale)


def _check_targets(name: str, targets: object) -> None:
    """`target_modules` names only projections this engine adapts (absent: the tensors say, checked later)."""
    if targets is None:
        return
    if isinstance(targets, str):  # PEFT reads a string as a regex: its tensors say what it matched
        unserved = next((m for m in UNSERVED_MODULES if m in targets), None)
        if unserved is not None:
            raise AdapterError(f"adapter {name!r}: target module {unserved!r} is not served")
        return
    listed = targets
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        raise AdapterError(f"adapter {name!r}: adapter_config.json `target_modules` must be a list of names")
    for target in listed:
        module = target.rsplit(".", 1)[-1]
        if module in UNSERVED_MODULES:
            raise AdapterError(f"adapter {name!r}: target module {module!r} is not served")
        if module not in TARGETS and target != "all-linear":
            raise AdapterError(
                f"adapter {name!r}: target module {target!r} is not served (only {', '.join(TARGETS)})"
            )


def _module_of(name: str, key: str) -> tuple[int, str, str]:
    """(layer, HF module, half) of a tensor name; AdapterError naming an unserved module by name."""
    match = _KEY.match(key)
    if match is None or match.group(3) not in TARGETS:
        unserved = next((m for m in UNSERVED_MODULES if m in key), None)
        if unserved is not None:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} targets {unserved!r}, which is not served")
        raise AdapterError(f"adapter {name!r}: tensor {key!r} targets no projection this engine adapts")
    return int(match.group(1)), match.group(3), match.group(4)


def _read_tensors(name: str, path: Path) -> tuple[dict[str, torch.Tensor], int]:
    """The tensors of adapter_model.safetensors and the file's size; AdapterError if it cannot be read."""
    file = path / "adapter_model.safetensors"
    try:
        return load_file(str(file)), file.stat().st_size
    except Exception as exc:  # a missing or corrupt file: safetensors raises several types
        raise AdapterError(f"adapter {name!r}: cannot read adapter_model.safetensors: {exc}") from exc


def _check_finite(name: str, key: str, tensor: torch.Tensor) -> None:
    """A weight with an inf or a NaN (as stored, or once cast to the dtype it is served in) is refused."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise AdapterError(f"adapter {name!r}: tensor {key!r} holds a value that is not finite")


def check_directory(name: str, path: str | Path, max_rank: int) -> int:
    """The checks of an adapter directory that need no model: its config (rank within `max_rank`, a finite
    scale, served options and target modules) and its tensors (named for served modules, finite). Returns
    its rank; AdapterError naming `name` otherwise. Reads the whole file: call it off any event loop."""
    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"adapter {name!r}: {path} is not a directory")
    rank, _ = read_config(name, path)
    if rank > max_rank:
        raise AdapterError(f"adapter {name!r}: rank {rank} exceeds max_lora_rank {max_rank}")
    tensors, _ = _read_tensors(name, path)
    for key, tensor in tensors.items():
        _module_of(name, key)
        _check_finite(name, key, tensor)
    if not tensors:
        raise AdapterError(f"adapter {name!r}: adapter_model.safetensors holds no LoRA tensors")
    return rank


def load_adapter(
    name: str, path: str | Path, cfg: ModelConfig, max_rank: int, dtype: torch.dtype, device: torch.device
) -> LoraAdapter:
    """Read and validate one PEFT adapter directory for `cfg`'s model; AdapterError naming `name` if broken."""
    path = Path(path)
    if not path.is_dir():
        raise AdapterError(f"adapter {name!r}: {path} is not a directory")
    rank, scale = read_config(name, path)
    if rank > max_rank:
        raise AdapterError(f"adapter {name!r}: rank {rank} exceeds max_lora_rank {max_rank}")
    tensors, size = _read_tensors(name, path)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        layer, module, half = _module_of(name, key)
        if not 0 <= layer < cfg.num_layers:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} names layer {layer} of {cfg.num_layers}")
        halves.setdefault((layer, module), {})[half] = tensor
    if not halves:
        raise AdapterError(f"adapter {name!r}: adapter_model.safetensors holds no LoRA tensors")
    weights = {
        key: _checked(name, cfg, key, pair, rank, dtype, device) for key, pair in sorted(halves.items())
    }
    return LoraAdapter(name, rank, scale, weights, load_bytes=size)


def _checked(
    name: str,
    cfg: ModelConfig,
    key: tuple[int, str],
    pair: dict[str, torch.Tensor],
    rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One module's (A, B) checked against the model's shapes, on the device in the model dtype."""
    layer, module = key
    if set(pair) != {"A", "B"}:
        raise AdapterError(f"adapter {name!r}: layer {layer} {module} lacks lora_A or lora_B")
    if module in MLP_MODULES and cfg.is_sparse(layer):
        raise AdapterError(f"adapter {name!r}: layer {layer} has routed experts; {module} is not adapted")
    d_in, d_out = module_shape(cfg, module)
    a, b = pair["A"], pair["B"]
    if tuple(a.shape) != (rank, d_in) or tuple(b.shape) != (d_out, rank):
        raise AdapterError(
            f"adapter {name!r}: layer {layer} {module} has A {tuple(a.shape)} and B {tuple(b.shape)}, "
            f"expected ({rank}, {d_in}) and ({d_out}, {rank})"
        )
    a, b = a.to(device=device, dtype=dtype).contiguous(), b.to(device=device, dtype=dtype).contiguous()
    _check_finite(name, f"layer {layer} {module} lora_A", a)
    _check_finite(name, f"layer {layer} {module} lora_B", b)
    return a, b
