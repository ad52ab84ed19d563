"""Loading model directories and building the embedded default model."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.worker.attention import AttentionMetadata
from engine.worker.loader import (
    DEFAULT_MODEL_NAME,
    LoadedModel,
    default_model_dir,
    load_model,
    resolve_dtype,
    write_default_model,
)
from gateway.cli import main as cli_main


@pytest.fixture(scope="module")
def default_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return default_model_dir(str(tmp_path_factory.mktemp("cache")))


@torch.no_grad()
def forward_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Logits of one sequence through the paged path, blocks 0..n in order."""
    cfg, block = loaded.config, 16
    blocks = -(-len(ids) // block)
    shape = (blocks, block, cfg.num_kv_heads, cfg.head_dim)
    caches = [
        (torch.zeros(shape, dtype=loaded.dtype), torch.zeros(shape, dtype=loaded.dtype))
        for _ in range(cfg.num_layers)
    ]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(len(ids)),
        block_tables=torch.arange(blocks).unsqueeze(0),
        query_start_loc=torch.tensor([0, len(ids)]),
        seq_lens=torch.tensor([len(ids)]),
        max_query_len=len(ids),
        max_seq_len=len(ids),
    )
    hidden = loaded.model(torch.tensor(ids), torch.arange(len(ids)), caches, meta)
    return loaded.model.compute_logits(hidden)  # type: ignore[operator,no-any-return]


def test_default_model_is_built_once_and_reused(tmp_path: Path) -> None:
    first = default_model_dir(str(tmp_path))
    weights = first / "model.safetensors"
    stamp = (weights.stat().st_ino, weights.stat().st_mtime_ns)
    again = default_model_dir(str(tmp_path))
    assert again == first
    assert (weights.stat().st_ino, weights.stat().st_mtime_ns) == stamp
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no staging dirs left


def test_default_model_dir_honours_fairserve_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRSERVE_CACHE", str(tmp_path / "env-cache"))
    built = default_model_dir()
    assert built.is_relative_to(tmp_path / "env-cache")
    assert (built / "config.json").is_file()


def test_parallel_first_use_builds_one_complete_copy(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(default_model_dir(str(tmp_path)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(set(results)) == 1 and len(results) == 3
    assert [p.name for p in results[0].parent.iterdir()] == [results[0].name]
    assert load_model(None, cache_dir=str(tmp_path), dtype="auto", device="cpu").config.num_layers == 4


def test_default_model_is_deterministic(tmp_path: Path, default_dir: Path) -> None:
    write_default_model(tmp_path)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (tmp_path / name).read_bytes() == (default_dir / name).read_bytes(), name


def test_default_model_loads_and_matches_transformers(default_dir: Path) -> None:
    ours = load_model(None, cache_dir=str(default_dir.parent.parent), dtype="auto", device="cpu")
    assert ours.name == DEFAULT_MODEL_NAME and ours.dtype == torch.float32 and ours.path == default_dir
    cfg = ours.config
    assert (cfg.architecture, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (
        "llama",
        256,
        4,
        8,
        4,
    )
    assert cfg.vocab_size == ours.tokenizer.vocab_size
    assert (
        cfg.eos_token_ids == ours.tokenizer.eos_token_ids and cfg.bos_token_id == ours.tokenizer.bos_token_id
    )
    ids = ours.tokenizer.encode("The batch never waits. ✓")
    hf = transformers.LlamaForCausalLM.from_pretrained(default_dir).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(forward_logits(ours, ids), ref, atol=1e-4, rtol=1e-4)
    hf_tok = transformers.AutoTokenizer.from_pretrained(default_dir)
    assert hf_tok(["héllo"])["input_ids"][0] == ours.tokenizer.encode("héllo")


def test_named_directory_is_served_under_its_name(tmp_path: Path, default_dir: Path) -> None:
    target = tmp_path / "my-model"
    shutil.copytree(default_dir, target)
    loaded = load_model(target, dtype="bfloat16", device="cpu")
    assert loaded.name == "my-model" and loaded.dtype == torch.bfloat16


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path: Path, default_dir: Path) -> None:
    tensors = load_file(default_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for p in default_dir.iterdir():
        if p.suffix == ".json":
            shutil.copy(p, tmp_path / p.name)
    for file, members in shards.items():
        save_file({n: tensors[n] for n in members}, tmp_path / file, metadata={"format": "pt"})
    # A stray file the index does not name must be ignored.
    save_file({"junk": torch.zeros(1)}, tmp_path / "stray.safetensors")
    index = {"metadata": {}, "weight_map": {n: f for f, ms in shards.items() for n in ms}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = list(range(40, 80))
    sharded = load_model(tmp_path, dtype="float32", device="cpu")
    single = load_model(default_dir, dtype="float32", device="cpu")
    assert torch.equal(forward_logits(sharded, ids), forward_logits(single, ids))

    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_model(tmp_path, dtype="auto", device="cpu")


def _copy_without(src: Path, dst: Path, *missing: str) -> Path:
    shutil.copytree(src, dst, ignore=lambda _d, names: [n for n in names if n in missing])
    return dst


def test_missing_files_give_clear_errors(tmp_path: Path, default_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere", dtype="auto", device="cpu")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(_copy_without(default_dir, tmp_path / "a", "config.json"), dtype="auto", device="cpu")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_model(_copy_without(default_dir, tmp_path / "b", "tokenizer.json"), dtype="auto", device="cpu")
    no_weights = _copy_without(default_dir, tmp_path / "c", "model.safetensors")
    (no_weights / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no \*\.safetensors weights \(found pytorch_model.bin"):
        load_model(no_weights, dtype="auto", device="cpu")


def test_bad_config_and_weights_are_named(tmp_path: Path, default_dir: Path) -> None:
    broken = _copy_without(default_dir, tmp_path / "arch")
    cfg = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**cfg, "architectures": ["FalconForCausalLM"]}))
    with pytest.raises(ValueError, match="FalconForCausalLM"):
        load_model(broken, dtype="auto", device="cpu")
    shapes = _copy_without(default_dir, tmp_path / "shape")
    (shapes / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 512}))
    with pytest.raises(
        ValueError, match=r"mlp\.\w+_proj\.weight. has shape \((688, 256|256, 688)\), expected"
    ):
        load_model(shapes, dtype="auto", device="cpu")


def test_auto_dtype_follows_the_checkpoint_but_not_fp16_on_cpu() -> None:
    assert resolve_dtype("auto", {"torch_dtype": "bfloat16"}, "cpu") == torch.bfloat16
    assert resolve_dtype("auto", {"dtype": "float16"}, "cpu") == torch.float32
    assert resolve_dtype("auto", {"torch_dtype": "float16"}, "cuda") == torch.float16
    assert resolve_dtype("auto", {}, "cpu") == torch.float32
    assert resolve_dtype("float16", {"torch_dtype": "float32"}, "cpu") == torch.float16
    with pytest.raises(ValueError, match="float64"):
        resolve_dtype("float64", {}, "cpu")


def test_cli_model_init_writes_a_loadable_model(
    tmp_path: Path, default_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tiny"
    assert cli_main(["model", "init", str(target)]) == 0
    out = capsys.readouterr().out
    assert "model.safetensors" in out and "config.json" in out
    assert (target / "model.safetensors").read_bytes() == (default_dir / "model.safetensors").read_bytes()
    assert load_model(target, dtype="auto", device="cpu").config.num_layers == 4
    assert cli_main(["model", "init", str(target)]) == 1
    assert "--force" in capsys.readouterr().err
    assert cli_main(["model", "init", str(target), "--force"]) == 0
