"""The `lora` knob: NAME=PATH pairs as the repeated flag gives them, refused under tensor parallelism."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.config import EngineConfig


def test_repeated_name_path_pairs_become_the_adapter_table() -> None:
    config = EngineConfig(lora=["a=/x/a", "b=/y=b"])  # type: ignore[arg-type]  # the flag's list form
    assert config.lora == {"a": "/x/a", "b": "/y=b"}


@pytest.mark.parametrize("pair", ["a", "=/x", "a="])
def test_a_pair_without_name_or_path_is_refused_naming_it(pair: str) -> None:
    with pytest.raises(ValidationError, match=f"lora {pair!r}: use NAME=PATH"):
        EngineConfig(lora=[pair])  # type: ignore[arg-type]


def test_an_adapter_named_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="adapter 'a' named twice"):
        EngineConfig(lora=["a=/x", "a=/y"])  # type: ignore[arg-type]


def test_adapters_are_refused_under_tensor_parallelism() -> None:
    with pytest.raises(ValidationError, match="not served with tensor_parallel_size > 1"):
        EngineConfig(lora={"a": "/x"}, tensor_parallel_size=2)
