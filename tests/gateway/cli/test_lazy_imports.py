"""The admin commands answer at once: each runs in a fresh interpreter without importing torch, the engine's
runtime or the web server (only the module of the command run is imported, gateway/cli/__init__.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Runs `fairserve ARGV...` in this interpreter, then prints which heavy modules it had imported.
_WRAPPER = """
import json, sys
from gateway.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --help and refusals exit through argparse
    code = exc.code
heavy = ["torch", "engine.serving.llm_engine", "engine.worker.executor", "uvicorn", "gateway.app"]
print(json.dumps({"rc": code, "loaded": [m for m in heavy if m in sys.modules]}), file=sys.stderr)
"""


def _run(data_dir: Path, *argv: str) -> tuple[int, list[str], str, list[str]]:
    """(exit status, heavy modules imported, stdout, stderr lines) of `fairserve ARGV` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAIRSERVE_DATA_DIR": str(data_dir)}
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, *argv], env=env, capture_output=True, text=True, timeout=120
    )
    *errors, last = done.stderr.strip().splitlines()
    report = json.loads(last)
    return int(report["rc"]), list(report["loaded"]), done.stdout, errors


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lazy")
    assert _run(path, "db", "upgrade")[0] == 0
    assert _run(path, "tenants", "add", "team-a", "--weight", "2")[0] == 0
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ("tenants", "list"),
        ("keys", "list"),
        ("usage",),
        ("config", "show"),
        ("tenants", "set", "team-a", "--weight", "3"),
    ],
)
def test_admin_commands_import_neither_torch_nor_the_engine(data_dir: Path, argv: tuple[str, ...]) -> None:
    rc, loaded, out, errors = _run(data_dir, *argv)
    assert rc == 0, errors
    assert loaded == [], f"`fairserve {' '.join(argv)}` imported {loaded}"


def test_serve_help_is_light_grouped_and_starts_with_what_a_new_user_needs(data_dir: Path) -> None:
    rc, loaded, out, _ = _run(data_dir, "serve", "--help")
    assert (rc, loaded) == (0, [])
    titles = [line for line in out.splitlines() if line and not line.startswith(" ")]
    sections = ["start here", "server", "model and engine", "fairness", "admission and quotas", "ledger"]
    sections += ["observability", "cluster"]
    order = [next(i for i, title in enumerate(titles) if title.startswith(name)) for name in sections]
    assert order == sorted(order)
    start = out.split("start here")[1].split("\nserver:")[0]
    first = [line.split()[0] for line in start.splitlines() if line.startswith("  --")]
    assert first[:5] == ["--config", "--model", "--host", "--port", "--device"]
    assert len(first) <= 11
    assert "--model DIR" in start
    # one name for the model: the old spellings are accepted (below) but not shown
    for hidden in ("--engine-model", "--local-models", "--grace-period-s", "--model LOCAL_MODELS"):
        assert hidden not in out
    assert out.startswith("usage: fairserve serve [--model DIR]")
    assert len(out.split("\n\n")[0].splitlines()) == 1  # the usage is one line, not a hundred


def test_a_bad_choice_is_one_line_without_the_usage(data_dir: Path) -> None:
    rc, loaded, out, errors = _run(data_dir, "serve", "--policy", "wfq")
    assert (rc, loaded, out) == (2, [], "")
    assert len(errors) == 1
    assert errors[0].startswith("fairserve serve: error: argument --policy: invalid choice: 'wfq'")
    assert "usage" not in errors[0]


def test_old_model_spellings_still_work(data_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    for flag in ("--engine-model", "--local-models", "--model"):
        rc, loaded, out, errors = _run(data_dir, "config", "show", "--json", flag, str(model))
        assert (rc, loaded) == (0, []), errors
        rows = {row["key"]: row["value"] for row in json.loads(out)}
        assert rows["engine.model"] == str(model), flag
