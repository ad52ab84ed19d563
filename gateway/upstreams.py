"""`serve --upstream MODEL=URL`: one `UpstreamEngine` per upstream model, probed before the gateway starts.

Every replica is probed at once (a thread each), so the whole check takes one probe's timeout however
many there are: an upstream that is down is one line and exit within 5 s, as an `--engine` is.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine import EngineClient
from engine.core.tokenizer import Tokenizer
from engine.serving.counter_sync import CounterSync
from engine.worker.loader import default_model_dir
from gateway.settings import GatewaySettings
from upstream.engine import UpstreamEngine
from upstream.probe import ProbeResult, probe


def upstream_engines(settings: GatewaySettings) -> dict[str, EngineClient]:
    """Each `--upstream` model's engine (its replicas probed), by the name clients send."""
    up = settings.upstream
    targets = [(model, url) for model, urls in up.replicas().items() for url in urls]
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        futures = [pool.submit(probe, url, model, up.kind, up.start_timeout_s) for model, url in targets]
        found = [f.result() for f in futures]  # the first failure raises UpstreamStartError, one line
    by_model: dict[str, list[ProbeResult]] = {}
    for (model, _), result in zip(targets, found, strict=True):
        by_model.setdefault(model, []).append(result)
    engines: dict[str, EngineClient] = {}
    for model, results in by_model.items():
        sync = None
        if settings.redis_url is not None:  # N gateways x M upstreams: one fair share per upstream model
            engine = settings.engine
            sync = CounterSync(
                settings.redis_url,
                engine.counter_sync_interval_s,
                f"{engine.counter_sync_prefix}:upstream:{model}",
            )
        engines[model] = UpstreamEngine(
            model,
            results,
            up,
            Tokenizer.from_dir(tokenizer_dir(settings, results)),
            settings.engine.fairness,
            settings.engine.caps,
            sync,
        )
    return engines


def tokenizer_dir(settings: GatewaySettings, found: list[ProbeResult]) -> Path:
    """Where the upstream model's tokenizer is read: `--upstream-tokenizer`, else the directory the engine
    loaded the model from when it is on this machine, else fairserve's own model (the embedded default)."""
    if settings.upstream.tokenizer is not None:
        return Path(settings.upstream.tokenizer)
    for result in found:  # vLLM names the directory `root`; transformers serve names the model by it
        for where in (result.root, result.upstream_model):
            if where and (Path(where) / "tokenizer.json").is_file():
                return Path(where)
    if settings.engine.model is not None:
        return Path(settings.engine.model)
    return default_model_dir(settings.engine.cache_dir)
