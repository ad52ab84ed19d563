"""Routing: many engines behind one EngineClient, each request sent where its prefix and the load say."""

from routing.config import RoutingSettings
from routing.loads import EngineLoad, engine_loads
from routing.models import ModelRouter, model_client, served_models
from routing.router import EngineRouter

__all__ = [
    "EngineLoad",
    "EngineRouter",
    "ModelRouter",
    "RoutingSettings",
    "engine_loads",
    "model_client",
    "served_models",
]
