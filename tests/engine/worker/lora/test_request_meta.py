"""RequestMeta.lora_path crosses every engine boundary: the worker pipe's and a remote engine's frames."""

from __future__ import annotations

import msgspec
import pytest

from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.serving.boundary.messages import Submit, ToEngine
from engine.serving.remote.messages import ToServer


@pytest.mark.parametrize("union", [ToEngine, ToServer], ids=["worker", "remote"])
def test_the_adapter_path_survives_a_submit_frame(union: object) -> None:
    meta = RequestMeta(tenant_id="t", lora="tuned", lora_path="/adapters/t/tuned")
    frame = msgspec.msgpack.encode(Submit("r", [1, 2], SamplingParams(), meta))
    decoded = msgspec.msgpack.decode(frame, type=union)
    assert isinstance(decoded, Submit)
    assert (decoded.meta.lora, decoded.meta.lora_path) == ("tuned", "/adapters/t/tuned")


def test_the_same_name_over_another_directory_keys_its_kv_apart() -> None:
    def root(path: str | None) -> bytes:
        return Request("r", [1], SamplingParams(), RequestMeta(lora="x", lora_path=path)).prefix_root

    assert len({root(None), root("/one"), root("/two")}) == 3
