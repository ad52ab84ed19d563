"""Fair share in front of engines fairserve does not own: `fairserve serve --upstream MODEL=URL`.

An upstream model (vLLM, SGLang, TGI, `transformers serve`, any OpenAI-compatible server) is one more
`EngineClient` (`UpstreamEngine`), so the gateway's pipeline, keys, deadlines and ledger are unchanged;
its requests are dispatched in the order of the same `fairness/` policies the engine's scheduler uses,
through an adaptive per-replica window (docs/upstream.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from upstream.config import UpstreamKind, UpstreamSettings, split_target
    from upstream.engine import UpstreamEngine
    from upstream.errors import QueuedPastDeadline, UpstreamFailed, UpstreamStartError
    from upstream.probe import ProbeResult

# Loaded on first use (PEP 562): the settings tree imports upstream.config, and reading settings
# (`fairserve config show`, `serve --help`) must not pull in the engine and torch behind UpstreamEngine.
# The probe function is imported from upstream.probe itself: once loaded, the submodule shadows a lazy name.
_WHERE = {
    "UpstreamKind": "upstream.config",
    "UpstreamSettings": "upstream.config",
    "split_target": "upstream.config",
    "UpstreamEngine": "upstream.engine",
    "QueuedPastDeadline": "upstream.errors",
    "UpstreamFailed": "upstream.errors",
    "UpstreamStartError": "upstream.errors",
    "ProbeResult": "upstream.probe",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'upstream' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


__all__ = [
    "ProbeResult",
    "QueuedPastDeadline",
    "UpstreamEngine",
    "UpstreamFailed",
    "UpstreamKind",
    "UpstreamSettings",
    "UpstreamStartError",
    "split_target",
]
