"""Tensor parallelism: one engine's model split over N ranks (docs/engine.md, "Tensor parallelism").

Rank 0 is the engine (scheduler, fair-share policy, sampler); ranks 1..N-1 are worker processes that hold
their shard of the weights and the KV cache and run each step's forward from one message rank 0 sends
(engine/worker/rank_steps.py). With N = 1 none of it runs: the model is built from its plain layers.
"""
