"""bench/gpu_check.sh fits one device command and runs on the bare device image with the listed wheels.

The device machine has Python with torch, triton, transformers and pytest (and what they depend on) but
nothing else of ours and no registry: whatever a step imports must come from bench/gpu_wheels.txt, or be
skipped with a reason. So the steps' modules are imported, and the kernel tests collected, by an
interpreter started without site-packages whose path holds only those distributions (links into this
virtualenv), as the device's would.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
WHEELS = ROOT / "bench" / "gpu_wheels.txt"
DEVICE_BASE = ("torch", "triton", "transformers", "pytest")  # the device image's own
COMMAND_LIMIT_S = 600  # one device command
STEPS_BUDGET_S = 420  # the steps' limits together, leaving the start, the wheels and the summary room
# What the `python -m` steps import lazily, inside their functions (not seen by importing the module).
LAZY_IMPORTS = {
    "experiments.gpu_kernels": ["fairserve_kernels.triton_attention", "fairserve_kernels.launch_heuristics"],
    "experiments.gpu_moe": ["fairserve_kernels.triton_moe", "fairserve_kernels.moe_reference"],
    "experiments.gpu_engine": ["engine", "engine.core.byte_tokenizer"],
}
STEP = re.compile(r"^\s*step (\w+) (\d+) \$PYTHON -m (\S+)(.*)$", re.MULTILINE)


def steps() -> list[tuple[str, int, str, str]]:
    """(name, limit seconds, module, arguments) of every step of the script."""
    return [(m[1], int(m[2]), m[3], m[4]) for m in STEP.finditer(SCRIPT.read_text())]


def wheel_names() -> list[str]:
    lines = (line.strip() for line in WHEELS.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_step_limits_fit_one_command_and_the_gate_runs_once() -> None:
    found = steps()
    names = [name for name, *_ in found]
    assert names == ["compile_gate", "kernel_tests", "gpu_kernels", "gpu_moe", "gpu_engine"]
    assert sum(limit for _, limit, *_ in found) <= STEPS_BUDGET_S < COMMAND_LIMIT_S
    kernel_tests = next(args for name, _, _, args in found if name == "kernel_tests")
    assert "--ignore=tests/fairserve_kernels/test_compile_gate.py" in kernel_tests.split()
    script = SCRIPT.read_text()
    # gpu_check.json is rewritten after every step, and each measuring step names its own JSON.
    assert script.count("write_json") >= 3 and "\n    write_json\n}" in script
    for name, _, module, args in found:
        if module != "pytest":
            assert f"$OUT_DIR/{name}.json" in args, f"{name} writes no JSON of its own"


def _closure(roots: list[str]) -> set[str]:
    """The installed distributions `roots` need (their requirements for this platform, no extras)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a platform's optional requirement (e.g. CUDA libraries of a CPU build)
        seen.add(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _device_path(tmp_path: Path) -> Path:
    """A folder linking the top-level entries (packages, modules, libraries, metadata) of the device base's
    distributions and of the listed wheels, and nothing else."""
    site = tmp_path / "site"
    site.mkdir()
    missing = [name for name in wheel_names() if not _installed(name)]
    assert not missing, f"listed wheels not installed here, so not checked: {missing}"
    for name in _closure(list(DEVICE_BASE)) | {canonicalize_name(n) for n in wheel_names()}:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or []}
        for top in tops:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            target, link = Path(str(dist.locate_file(top))), site / top
            if target.exists() and not link.exists():
                link.symlink_to(target)
    return site


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def _device_python(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON_"))}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{site}"
    # -S: no site-packages (this virtualenv's); -s: no user site. Only the linked folder and the tree.
    return subprocess.run(
        [sys.executable, "-S", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_a_bare_interpreter_with_the_listed_wheels_imports_every_step(tmp_path: Path) -> None:
    site = _device_path(tmp_path)
    probe = _device_python(site, "-c", "import fastapi")
    assert probe.returncode != 0, "the bare path must not see this virtualenv's other packages"
    modules = [module for _, _, module, _ in steps() if module != "pytest"]
    modules += [lazy for module in modules for lazy in LAZY_IMPORTS.get(module, [])]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    imported = _device_python(site, "-c", code, *modules)
    assert imported.returncode == 0, imported.stderr[-3000:]
    kernel_tests = next(args for name, _, _, args in steps() if name == "kernel_tests").split()
    paths = [arg for arg in kernel_tests if arg.startswith("tests/") or arg.startswith("--ignore")]
    collected = _device_python(
        site,
        "-m",
        "pytest",
        "--collect-only",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rs",
        *paths,
    )
    report = collected.stdout + collected.stderr
    assert collected.returncode == 0, report[-3000:]
    assert "error" not in report.lower().split("warnings summary")[0], report[-3000:]
    assert "test_compile_gate.py" not in report
    # A module skipped at collection says why (pytest.importorskip's reason).
    for line in report.splitlines():
        if line.startswith("SKIPPED"):
            assert re.search(r":\d+: \S", line), line
