"""The engine's core loads without torch (issue 55): every module of engine/core/, imported in a fresh
interpreter, leaves torch unimported. import-linter's contract says it of the imports as written; this
says it of what actually runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[3] / "engine" / "core"


def test_every_core_module_imports_without_loading_torch() -> None:
    modules = sorted(f"engine.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__")
    assert "engine.core.scheduler" in modules and "engine.core.kv_cache" in modules
    script = "\n".join(
        ["import importlib, sys", *(f"importlib.import_module({m!r})" for m in modules)]
        + ["print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"]
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=CORE.parents[1], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
