"""The engine's core: requests and their states, the scheduler, the KV block pool, fairness hooks, deadlines, stop rules. It imports no torch (docs/architecture.md, "Three houses")."""
