"""The `lora` knob: NAME=PATH pairs as the repeated flag gives them, each a PEFT directory, refused under
tensor parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig


def _adapter(root: Path, name: str) -> str:
    """A directory that looks like a PEFT adapter to the start-up check (its adapter_config.json)."""
    found = root / name
    found.mkdir(parents=True)
    (found / "adapter_config.json").write_text("{}")
    return str(found)


def test_repeated_name_path_pairs_become_the_adapter_table(tmp_path: Path) -> None:
    a, b = _adapter(tmp_path, "a"), _adapter(tmp_path, "y=b")
    config = EngineConfig(lora=[f"a={a}", f"b={b}"])  # type: ignore[arg-type]  # the flag's list form
    assert config.lora == {"a": a, "b": b}


@pytest.mark.parametrize("pair", ["a", "=/x", "a="])
def test_a_pair_without_name_or_path_is_refused_naming_it(pair: str) -> None:
    with pytest.raises(ValidationError, match=f"lora {pair!r}: use NAME=PATH"):
        EngineConfig(lora=[pair])  # type: ignore[arg-type]


def test_an_adapter_named_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="adapter 'a' named twice"):
        EngineConfig(lora=["a=/x", "a=/y"])  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_a_path_that_is_no_adapter_directory_is_refused_naming_it(tmp_path: Path, where: str) -> None:
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    with pytest.raises(ValidationError, match=f"lora bad={path}: not a PEFT adapter directory"):
        EngineConfig(lora=[f"bad={path}"])  # type: ignore[arg-type]


def test_adapters_are_refused_under_tensor_parallelism(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="not served with tensor_parallel_size > 1"):
        EngineConfig(lora={"a": _adapter(tmp_path, "a")}, tensor_parallel_size=2)
