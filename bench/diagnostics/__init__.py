"""Diagnostics: one-off investigations kept runnable because docs/gateway.md cites their findings.

None of them is part of `fairserve bench`; each answers one question about this machine or the
gateway's event loop, and docs/bench.md ("Diagnostics") lists the command and the finding:

- `jitter`: how much the VM itself stalls a busy thread or oversleeps a waking one (no fairserve code).
- `loop_lag`: how late the gateway's event loop wakes while the ledger writes, at two GIL switch intervals.
- `submit_wake`: how long handing a request to an idle engine worker holds the loop, by worker CPU policy.
- `report_wire`: what one iteration's outputs cost from engine loop to gateway, whole outputs vs deltas.
"""
