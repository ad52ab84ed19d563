"""Diagnostics: one-off investigations kept runnable because docs/gateway.md cites their findings.

Each answers one question about this machine or the gateway's event loop; experiments/README.md lists
the finding and its date:

- `jitter`: how much the VM itself stalls a busy thread or oversleeps a waking one (no fairserve code).
- `loop_lag`: how late the gateway's event loop wakes while the ledger writes, at two GIL switch intervals.
- `report_wire`: what one iteration's outputs cost from engine loop to gateway, whole outputs vs deltas.
"""
