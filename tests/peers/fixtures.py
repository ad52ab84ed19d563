"""Fixtures for the engines fairserve fronts with `--upstream`: a real `transformers serve` and the
vLLM simulator. Re-export them from a conftest (`from tests.peers.fixtures import transformers_engine`).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.transformers_peer import TransformersServe
from bench.vllm_sim.process import SimProcess, running_sim


@pytest.fixture(scope="session")
def transformers_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TransformersServe]:
    """`transformers serve --continuous-batching` over the model `fairserve model init DIR` writes, offline,
    on a free port, once it answers /v1/models; stopped after the session. Its model id is the directory."""
    root = tmp_path_factory.mktemp("transformers-serve")
    model_dir = root / "model"
    subprocess.run(
        [sys.executable, "-m", "gateway.cli", "model", "init", str(model_dir)],
        check=True,
        capture_output=True,
    )
    server = TransformersServe(model_dir, root / "serve.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def vllm_sim() -> Iterator[SimProcess]:
    """The vLLM simulator (bench/vllm_sim): 8 slots, a 10 ms step, model "sim"; one per test."""
    with running_sim() as sim:
        yield sim
