"""What each kind of upstream engine gives: its queue metric, the stream options it takes, how to tell it.

vLLM and SGLang report usage on every streamed chunk when asked (`continuous_usage_stats`), so the
dispatcher charges each output token as the engine counts it; TGI and a plain OpenAI-compatible server
(`transformers serve`) report usage once at the end at most, and the gateway counts in between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KindTraits:
    """One kind of upstream engine."""

    name: str
    queue_metric: str | None  # the Prometheus gauge of the engine's own waiting queue
    continuous_usage: bool  # takes stream_options.continuous_usage_stats
    marker: str  # a prefix that only this engine's /metrics has

    def stream_options(self) -> dict[str, Any]:
        """What the call asks for in `stream_options`: usage at the end always, per chunk where it exists."""
        options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            options["continuous_usage_stats"] = True
        return options


KINDS: dict[str, KindTraits] = {
    "vllm": KindTraits("vllm", "vllm:num_requests_waiting", True, "vllm:"),
    "sglang": KindTraits("sglang", "sglang:num_queue_reqs", True, "sglang:"),
    "tgi": KindTraits("tgi", "tgi_queue_size", False, "tgi_"),
    "openai": KindTraits("openai", None, False, ""),
}


def detect_kind(metrics_text: str | None, owned_by: str | None) -> str:
    """The kind a probe found: from the metric names first (each engine prefixes its own), then from the
    `owned_by` of /v1/models; `openai` when neither tells."""
    if metrics_text:
        for name in ("vllm", "sglang", "tgi"):
            if KINDS[name].marker in metrics_text:
                return name
    if owned_by in ("vllm", "sglang"):
        return owned_by
    return "openai"


def gauge_value(metrics_text: str, name: str) -> float | None:
    """The sum of gauge `name` over its label sets in a Prometheus text page; None when it is absent.

    Read by hand rather than with prometheus_client's parser: this runs every 50 ms per replica and needs
    one family out of hundreds, so a line scan is several times cheaper than building every family.
    """
    total: float | None = None
    for line in metrics_text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest[:1] not in ("{", " "):
            continue  # another metric whose name starts with this one
        try:
            value = float(
                rest.rsplit(" ", 1)[-1] if rest.startswith(" ") else rest.rsplit("}", 1)[1].split()[0]
            )
        except (IndexError, ValueError):
            continue
        total = value if total is None else total + value
    return total
