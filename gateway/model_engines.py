"""`serve --model A --model B`: one local engine per model behind a ModelRouter (routing/models.py)."""

from __future__ import annotations

from engine import EngineClient, engine_client
from gateway.settings import GatewaySettings
from routing import ModelRouter


def local_models(settings: GatewaySettings) -> ModelRouter:
    """An engine of its own (the settings' engine knobs, its own model) for each `models.local_models`
    directory, grouped by the name each serves (its directory's name); only the first loads `--lora`."""
    engines: list[tuple[str, EngineClient]] = []
    for i, directory in enumerate(settings.models.local_models):
        update: dict[str, object] = {"model": directory, "served_model_name": None}
        if i:  # `--lora` adapters run over the default (first) model only (gateway/openai/served.py)
            update["lora"] = {}
        config = settings.engine.model_copy(update=update)
        engines.append((directory, engine_client(config, in_process=not settings.engine_process)))
    return ModelRouter.of(engines, settings.routing)
