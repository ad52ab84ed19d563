"""fairserve on a Ray cluster (`fairserve ray ...`, the `ray` extra).

Ray places, restarts and scales the processes; fairserve's own parts run inside its actors unchanged:
each engine actor runs an `engine.serving.remote.server.EngineServer`, each gateway actor runs the gateway app
under uvicorn in front of a `routing.EngineRouter`, and a named registry actor tells the gateways which
engines exist. Nothing else in fairserve imports this package (an import-linter contract).
"""
