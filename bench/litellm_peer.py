"""The litellm proxy as a peer gateway: a subprocess in front of fairserve, on 127.0.0.1.

litellm is the optional `bench` extra; its pins conflict with the dev environment, so it may live in a
virtualenv of its own (`--litellm-bin PATH` or `FAIRSERVE_LITELLM_BIN`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.server import free_port

ENV_BIN = "FAIRSERVE_LITELLM_BIN"


def find_litellm(explicit: str | None = None) -> str | None:
    """The `litellm` executable: the flag, the environment variable, next to this Python, or on PATH."""
    for candidate in (
        explicit,
        os.environ.get(ENV_BIN),
        str(Path(sys.executable).with_name("litellm")),
        shutil.which("litellm"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


class LiteLLMProxy:
    """A running `litellm --config` proxy whose one model forwards to fairserve's /v1 API."""

    def __init__(
        self, binary: str, upstream_url: str, upstream_key: str, model: str, timeout_s: float = 90.0
    ) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="fairserve-litellm-")
        self.master_key = "sk-bench-" + secrets.token_urlsafe(24)
        config, port = Path(self.dir.name) / "config.yaml", free_port()
        # text-completion-openai: litellm's provider for an OpenAI-compatible /v1/completions upstream.
        config.write_text(
            "model_list:\n"
            f"  - model_name: {model}\n"
            "    litellm_params:\n"
            f"      model: text-completion-openai/{model}\n"
            f"      api_base: {upstream_url}/v1\n"
            "      api_key: os.environ/FAIRSERVE_UPSTREAM_KEY\n"
            "litellm_settings:\n"
            "  telemetry: false\n"
            "  drop_params: true\n"
        )
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": self.master_key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "FAIRSERVE_UPSTREAM_KEY": upstream_key,
            "LITELLM_LOG": "ERROR",
            "NO_DOCS": "True",
        }
        self.log = open(Path(self.dir.name) / "litellm.log", "w")  # noqa: SIM115 - lives as long as the proxy
        argv = [binary, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"litellm did not answer within {timeout_s:.0f}s")

    def tail(self, n: int = 400) -> str:
        """The end of the proxy's log, for error messages."""
        self.log.flush()
        return (Path(self.dir.name) / "litellm.log").read_text(errors="replace")[-n:]

    def stop(self) -> None:
        """Terminate the proxy and remove its files."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        self.dir.cleanup()
