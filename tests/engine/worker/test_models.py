"""Model forward parity with `transformers` for every registered architecture over the paged flat-batch path."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine.core.byte_tokenizer import write_byte_tokenizer
from engine.worker.attention import AttentionMetadata
from engine.worker.loader import LoadedModel, iter_tensors, load_model, safetensors_files
from engine.worker.models import ModelConfig, build_model

BLOCK_SIZE = 16
NUM_BLOCKS = 24
VOCAB = 300  # larger than the byte tokenizer (262), as real checkpoints pad their vocabularies
COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.1,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "llama-bias-tied-llama3": (
        "LlamaConfig",
        {"attention_bias": True, "tie_word_embeddings": True, "rope_parameters": LLAMA3_ROPE},
    ),
    "qwen2": ("Qwen2Config", {}),
    "mistral": ("MistralConfig", {"sliding_window": 8}),
    "qwen3-tied": ("Qwen3Config", {"head_dim": 16, "tie_word_embeddings": True}),
    # Layer 0 routes (norm_topk_prob), layer 1 is dense (mlp_only_layers).
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "head_dim": 16,
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    # Layer 0 slides (window 8, local RoPE base), layer 1 is global; final logits soft-capped.
    "gemma3": (
        "Gemma3TextConfig",
        {
            "head_dim": 16,
            "sliding_window": 8,
            "sliding_window_pattern": 2,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 10.0,
        },
    ),
}
# Saved in small shards with an index, as large checkpoints are.
SHARDED = ("qwen3_moe", "gemma3")


@dataclass
class Pair:
    """Our loaded model and the HF reference built from the same saved directory."""

    ours: LoadedModel
    hf: Any
    path: Path


def _save_hf_model(root: Path, variant: str) -> Any:
    config_cls, extra = VARIANTS[variant]
    cfg = getattr(transformers, config_cls)(**COMMON, **extra)
    torch.manual_seed(sum(map(ord, variant)))
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Norm weights start at 1 and biases at 0; perturb them so a mis-loaded one shows.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(root, max_shard_size="100KB" if variant in SHARDED else "5GB")
    write_byte_tokenizer(root)
    return hf.eval()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Pair:
    root = tmp_path_factory.mktemp(request.param)
    hf = _save_hf_model(root, request.param)
    return Pair(load_model(root, dtype="float32", device="cpu"), hf, root)


class PagedSequences:
    """KV caches for a model plus a shuffled, non-contiguous block table per sequence."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, num_seqs: int, seed: int = 0) -> None:
        shape = (NUM_BLOCKS, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(cfg.num_layers)
        ]
        blocks = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(blocks)
        per_seq = NUM_BLOCKS // num_seqs
        self.tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(num_seqs)]

    def batch(self, spans: list[tuple[int, int]]) -> tuple[torch.Tensor, AttentionMetadata]:
        """Positions and metadata for one flat batch; spans[i] = (tokens already cached, query length) of seq i."""
        positions, slots, starts, lens = [], [], [0], []
        for table, (cached, qlen) in zip(self.tables, spans, strict=False):
            pos = list(range(cached, cached + qlen))
            positions += pos
            slots += [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in pos]
            starts.append(starts[-1] + qlen)
            lens.append(cached + qlen)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots),
            block_tables=torch.tensor(self.tables[: len(spans)]),
            query_start_loc=torch.tensor(starts),
            seq_lens=torch.tensor(lens),
            max_query_len=max(q for _, q in spans),
            max_seq_len=max(lens),
        )
        return torch.tensor(positions), meta


@torch.no_grad()
def run_logits(
    model: Any, paged: PagedSequences, ids: list[int], spans: list[tuple[int, int]]
) -> torch.Tensor:
    """Logits of every token of one flat batch."""
    positions, meta = paged.batch(spans)
    hidden = model(torch.tensor(ids), positions, paged.kv_caches, meta)
    logits: torch.Tensor = model.compute_logits(hidden)
    return logits


def prompt_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_full_sequence_logits_match_hf(pair: Pair) -> None:
    ids = prompt_ids(40, seed=1)
    paged = PagedSequences(pair.ours.config, torch.float32, num_seqs=1)
    ours = run_logits(pair.ours.model, paged, ids, [(0, len(ids))])
    with torch.no_grad():
        ref = pair.hf(torch.tensor([ids])).logits[0].float()
    assert ours.dtype == torch.float32 and ours.shape == (len(ids), VOCAB)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_sliding_window_matters_for_mistral(tmp_path: Path) -> None:
    hf = _save_hf_model(tmp_path, "mistral")
    ours = load_model(tmp_path, dtype="float32", device="cpu")
    assert ours.config.sliding_window == 8
    full = build_model(replace(ours.config, sliding_window=None), torch.float32, torch.device("cpu"))
    full.load_weights(hf.state_dict().items())  # type: ignore[operator]
    ids = prompt_ids(30, seed=2)
    windowed = run_logits(ours.model, PagedSequences(ours.config, torch.float32, 1), ids, [(0, 30)])
    unwindowed = run_logits(full, PagedSequences(ours.config, torch.float32, 1), ids, [(0, 30)])
    # Identical inside the window, different once the context outgrows it.
    torch.testing.assert_close(windowed[:8], unwindowed[:8])
    assert (windowed[8:] - unwindowed[8:]).abs().max() > 1e-2


def test_greedy_generation_matches_hf(pair: Pair) -> None:
    ids = prompt_ids(21, seed=3)
    new_tokens = 20
    with torch.no_grad():
        ref = pair.hf.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )[0, len(ids) :].tolist()
    model = pair.ours.model
    paged = PagedSequences(pair.ours.config, torch.float32, num_seqs=1, seed=7)
    # Prefill in two chunks, then one-token decodes, all through the paged cache.
    run_logits(model, paged, ids[:13], [(0, 13)])
    logits = run_logits(model, paged, ids[13:], [(13, len(ids) - 13)])
    generated = [int(logits[-1].argmax())]
    while len(generated) < new_tokens:
        logits = run_logits(model, paged, generated[-1:], [(len(ids) + len(generated) - 1, 1)])
        generated.append(int(logits[-1].argmax()))
    assert generated == ref


def test_batched_flat_forward_equals_separate_forwards(pair: Pair) -> None:
    model, cfg = pair.ours.model, pair.ours.config
    seqs = [prompt_ids(n, seed=10 + n) for n in (5, 17, 33)]
    separate = []
    for s in seqs:
        paged = PagedSequences(cfg, torch.float32, num_seqs=1, seed=len(s))
        separate.append(run_logits(model, paged, s, [(0, len(s))]))
    batched_cache = PagedSequences(cfg, torch.float32, num_seqs=3, seed=99)
    batched = run_logits(model, batched_cache, sum(seqs, []), [(0, len(s)) for s in seqs])
    torch.testing.assert_close(batched, torch.cat(separate), atol=1e-5, rtol=1e-5)
    # A batched decode step over the same caches continues each sequence as HF does.
    next_ids = [int(sep[-1].argmax()) for sep in separate]
    decoded = run_logits(model, batched_cache, next_ids, [(len(s), 1) for s in seqs])
    for i, s in enumerate(seqs):
        with torch.no_grad():
            ref = pair.hf(torch.tensor([s + [next_ids[i]]])).logits[0, -1]
        torch.testing.assert_close(decoded[i], ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype_name,dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_half_precision_loads_and_runs(pair: Pair, dtype_name: str, dtype: torch.dtype) -> None:
    half = load_model(pair.path, dtype=dtype_name, device="cpu")
    assert half.dtype == dtype
    assert all(p.dtype == dtype for p in half.model.parameters())
    ids = prompt_ids(24, seed=4)
    paged = PagedSequences(half.config, dtype, num_seqs=1)
    positions, meta = paged.batch([(0, len(ids))])
    with torch.no_grad():
        hidden = half.model(torch.tensor(ids), positions, paged.kv_caches, meta)
        logits = half.model.compute_logits(hidden)  # type: ignore[operator]
        ref = pair.hf(torch.tensor([ids])).logits[0]
    assert hidden.dtype == dtype and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # Close to the fp32 reference up to half-precision rounding.
    cos = torch.nn.functional.cosine_similarity(logits, ref, dim=-1)
    assert cos.min() > 0.98


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(
        ValueError, match="GPT2LMHeadModel.*supported: .*Qwen3MoeForCausalLM.*Gemma3ForCausalLM"
    ):
        ModelConfig.from_hf_config({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64})
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        ModelConfig.from_hf_config(
            {
                "model_type": "llama",
                "vocab_size": 10,
                "hidden_size": 8,
                "intermediate_size": 16,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
            }
        )
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig.from_hf_config(
            {
                "model_type": "qwen2",
                "vocab_size": 10,
                "hidden_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
            }
        )


def test_load_weights_rejects_missing_and_misshaped_tensors(pair: Pair) -> None:
    cfg = pair.ours.config
    # The checkpoint's names (transformers' in-memory MoE names fuse the experts; files list them one by one).
    state = dict(iter_tensors(safetensors_files(pair.path)))
    model = build_model(cfg, torch.float32, torch.device("cpu"))
    missing = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ValueError, match=r"missing tensors: model\.layers\.1\.mlp\.up_proj\.weight"):
        model.load_weights(missing.items())  # type: ignore[operator]
    bad = dict(state)
    bad["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, cfg.hidden_size)
    with pytest.raises(ValueError, match=r"k_proj\.weight.*shape \(3, 64\)"):
        model.load_weights(bad.items())  # type: ignore[operator]
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'model.layers.9.foo'"):
        model.load_weights([*state.items(), ("model.layers.9.foo", torch.zeros(1))])  # type: ignore[operator]


def test_projections_are_merged_at_load(pair: Pair) -> None:
    """q/k/v and gate/up are one GEMM each: one weight, the checkpoint's separate tensors concatenated."""
    state = dict(iter_tensors(safetensors_files(pair.path)))
    model: Any = pair.ours.model
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    assert {"qkv_proj", "gate_up_proj"} <= leaves
    assert not leaves & {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}"
        qkv = torch.cat([state[f"{p}.self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
        if f"{p}.self_attn.q_proj.bias" in state:
            bias = torch.cat([state[f"{p}.self_attn.{n}_proj.bias"] for n in "qkv"])
            assert torch.equal(layer.self_attn.qkv_proj.bias, bias)
        if f"{p}.mlp.gate_proj.weight" in state:  # a dense layer (Qwen3-MoE's routed ones keep their experts)
            gate_up = torch.cat([state[f"{p}.mlp.{n}_proj.weight"] for n in ("gate", "up")])
            assert torch.equal(layer.mlp.gate_up_proj.weight, gate_up)


def test_new_architectures_read_their_options(tmp_path: Path) -> None:
    """The config fields each new architecture needs reach ModelConfig (and sharded checkpoints load)."""
    moe = load_model(_saved(tmp_path / "moe", "qwen3_moe"), dtype="float32", device="cpu").config
    assert (moe.architecture, moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob) == (
        "qwen3_moe",
        4,
        2,
        True,
    )
    assert [moe.is_sparse(i) for i in range(2)] == [True, False] and moe.qk_norm
    assert len(list((tmp_path / "moe").glob("model-*.safetensors"))) > 1
    gemma = load_model(_saved(tmp_path / "gemma", "gemma3"), dtype="float32", device="cpu").config
    assert gemma.layer_types == ["sliding_attention", "full_attention"]
    assert [gemma.window(i) for i in range(2)] == [8, None]
    assert gemma.local_rope_theta == 10000.0 and gemma.rope_theta == 1_000_000.0
    assert gemma.embed_scale == 8.0 and gemma.attn_scale == 0.25 and gemma.final_soft_cap == 10.0
    assert gemma.hidden_act == "gelu_pytorch_tanh" and gemma.tie_word_embeddings


def test_sparse_step_picks_the_routed_layers() -> None:
    base = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
    }
    d = base | {"num_hidden_layers": 4, "num_attention_heads": 2, "num_experts": 4, "num_experts_per_tok": 2}
    cfg = ModelConfig.from_hf_config(
        d | {"moe_intermediate_size": 4, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    )
    assert [cfg.is_sparse(i) for i in range(4)] == [False, True, False, False]
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf_config(d | {"moe_intermediate_size": 4, "num_experts_per_tok": 5})


def _saved(root: Path, variant: str) -> Path:
    _save_hf_model(root, variant)
    return root
