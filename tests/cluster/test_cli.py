"""The `ray` entry point is installed with or without the `ray` extra and every `fairserve` command loads
it: without Ray, `fairserve` still works and `fairserve ray ...` says how to get it."""

from __future__ import annotations

import subprocess
import sys

from tests.cluster.conftest import ROOT

WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # as if the extra were not installed: `import ray` raises ModuleNotFoundError
from gateway.cli import build_parser, main
parser = build_parser()
assert "ray" in parser._subparsers._group_actions[0].choices, "the ray commands are not registered"
sys.exit(main(["ray", "status"]))
"""


def test_fairserve_without_ray_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'fairserve[ray]'" in done.stderr
    assert "Traceback" not in done.stderr
