"""`transformers serve --continuous-batching` as a peer engine: Hugging Face's own OpenAI-compatible
server, run as a process on 127.0.0.1 over the embedded model (`fairserve model init DIR`), offline.

It is the real engine nobody here wrote that fairserve's upstream mode is tested and measured against
(docs/upstream-deploy.md, "What each engine gives"): it streams, aborts a request whose client leaves,
sends usage in a stream only when asked with `stream_options`, has no `/metrics`, and ends a stream
without `data: [DONE]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.server import free_port
from engine.worker.loader import write_default_model

# Left to size itself, the continuous-batching cache takes most of the host's memory on CPU (13.7 GB
# resident for the 12 MB embedded model here, before it answered). 256 blocks of 32 tokens hold 8192
# tokens: two dozen streams of a few hundred tokens each, with room to spare.
CACHE_FLAGS = ("--cb-num-blocks", "256", "--cb-block-size", "32", "--cb-max-batch-tokens", "512")


def transformers_cli() -> str:
    """The `transformers` executable beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("transformers")
    return str(beside) if beside.is_file() else "transformers"


class TransformersServe:
    """A running `transformers serve --continuous-batching MODEL_DIR` on a free loopback port."""

    def __init__(
        self, model_dir: Path, log_path: Path, timeout_s: float = 180.0, extra: Sequence[str] = ()
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        argv = [transformers_cli(), "serve", "--continuous-batching", *CACHE_FLAGS, *extra]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), str(model_dir)]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        self._log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self.model = self._wait_until_it_answers(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_until_it_answers(self, timeout_s: float) -> str:
        """Poll GET /v1/models until it answers 200 (the model is loaded and warmed up); its model id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"transformers serve exited with {self.proc.returncode}: {self.log()[-800:]}"
                )
            try:
                resp = httpx.get(f"{self.url}/v1/models", timeout=2.0)
                if resp.status_code == 200 and resp.json()["data"]:
                    return str(resp.json()["data"][0]["id"])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # a poll interval: the server gives no readiness event to wait on
        raise RuntimeError(f"transformers serve did not answer in {timeout_s:.0f}s: {self.log()[-800:]}")

    def log(self) -> str:
        """Everything it printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s (it also ends its engine process, which exits with its parent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@contextmanager
def transformers_serve(
    model_dir: Path | None = None, timeout_s: float = 180.0, extra: Sequence[str] = ()
) -> Iterator[TransformersServe]:
    """A `TransformersServe` for a with-block, over `model_dir` or a fresh embedded model in a temp dir."""
    with tempfile.TemporaryDirectory(prefix="fairserve-transformers-") as tmp:
        if model_dir is None:
            model_dir = Path(tmp) / "model"
            write_default_model(model_dir)  # what `fairserve model init DIR` writes
        server = TransformersServe(model_dir, Path(tmp) / "serve.log", timeout_s, extra)
        try:
            yield server
        finally:
            server.stop()
