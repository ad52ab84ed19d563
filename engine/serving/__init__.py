"""The engine's serving shells: the engine loop and its step (llm_engine), the boundary to the gateway, remote engines, disaggregation and counter sync. They sit above the core and the worker."""
