"""Engines on their own: an engine server on ZeroMQ TCP (server.py) that many gateways reach through
`RemoteEngine` (client.py), the same `EngineClient` surface as the local process engine."""
