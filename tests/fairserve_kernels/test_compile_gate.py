"""The compile gate: every Triton kernel compiles to a cubin for sm_90 and sm_80 with Triton's own compiler.

The gate runs in a subprocess: this directory's conftest sets TRITON_INTERPRET=1, and the interpreter
is what let a kernel the compiler refuses pass every CPU test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fairserve_kernels.compile_gate import Variant, kernel_modules, pairwise_cover
from fairserve_kernels.launch_heuristics import MAX_SPLITS, choose_num_splits

REPO = Path(__file__).resolve().parents[2]
# The gate's run (enumerating the launch code's variants, compiling their pairwise cover and every prefill
# candidate) took 400 s alone in one process on this 2-core machine once the 128-row prefill tiles came
# (2026-12-07; 117 s before): it runs in the serial part, alone, on both cores (`--jobs 2`). Its own bound
# is the subprocess's 1,200 s, so the tests' is the same.
pytestmark = [pytest.mark.timeout(1260), pytest.mark.serial]


def _run_gate(tmp_path: Path, *args: str, pythonpath: str = "") -> tuple[int, str, dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, str(REPO), env.get("PYTHONPATH", "")) if p)
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fairserve_kernels.compile_gate", "--json", str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, report


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict[str, Any]]:
    return _run_gate(tmp_path_factory.mktemp("gate"), "--jobs", "2")


def test_every_kernel_compiles_for_sm90_and_sm80(gate: tuple[int, str, dict[str, Any]]) -> None:
    rc, output, report = gate
    assert rc == 0, output
    assert report["failures"] == []
    assert set(report["archs"]) == {"sm_90", "sm_80"}
    for kernels in report["archs"].values():
        modules = {name.split(".")[0] for name in kernels}
        assert modules == {m.rsplit(".", 1)[-1] for m in kernel_modules()}
        assert all(k["compiled"] >= 1 for k in kernels.values())
    assert report["compiled"] == sum(k["compiled"] for a in report["archs"].values() for k in a.values())


def test_every_value_the_launch_code_picks_is_compiled(gate: tuple[int, str, dict[str, Any]]) -> None:
    """Split counts, tiles, dtypes, windows, soft caps: each value any launch asked for is in a compiled variant."""
    _, output, report = gate
    for arch, kernels in report["archs"].items():
        for name, kernel in kernels.items():
            assert kernel["compiled_values"] == kernel["values"], f"{arch} {name}"
    attention = report["archs"]["sm_90"]["triton_attention._paged_attention_kernel"]["values"]
    # The split counts are the heuristic's own: whatever choose_num_splits can return for the decode shapes.
    reachable = {choose_num_splits(2 * seqs, ctx, 132) for seqs in range(1, 257) for ctx in (1, 32768)}
    assert {int(s) for s in attention["NUM_SPLITS"]} >= reachable | {MAX_SPLITS}
    assert attention["USE_WINDOW"] == ["False", "True"] and attention["USE_SOFT_CAP"] == ["False", "True"]
    assert {"*bf16", "*fp16", "*fp32"} <= set(attention["dtype:query_ptr"])
    assert {"64", "80", "256"} <= set(attention["HEAD_DIM"])
    # SGMV: decode and prefill row tiles, and each rank tile (16 up to the 64-wide loop), every dtype.
    shrink = report["archs"]["sm_80"]["triton_lora._sgmv_shrink_kernel"]["values"]
    assert shrink["BLOCK_M"] == ["16", "64"] and shrink["BLOCK_R"] == ["16", "32", "64"]
    assert {"*bf16", "*fp16", "*fp32"} <= set(shrink["dtype:x_ptr"])


def test_a_kernel_the_compiler_refuses_fails_the_gate(tmp_path: Path) -> None:
    """The failure this gate exists for: a plain module-level float read inside a kernel."""
    package = tmp_path / "gate_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "triton_bad.py").write_text(
        textwrap.dedent(
            """
            import torch, triton, triton.language as tl

            SCALE = 1.5  # not tl.constexpr: the interpreter reads it, the compiler refuses it

            @triton.jit
            def _scale_kernel(x_ptr, N: tl.constexpr):
                offs = tl.arange(0, N)
                tl.store(x_ptr + offs, tl.load(x_ptr + offs) * SCALE)

            def compile_gate_cases():
                yield lambda: _scale_kernel[(1,)](torch.empty(16, device="meta"), N=16)
            """
        )
    )
    rc, output, report = _run_gate(
        tmp_path, "--module", "gate_probe.triton_bad", "--arch", "90", pythonpath=str(tmp_path)
    )
    assert rc == 1, output
    assert len(report["failures"]) == 1
    assert "SCALE" in report["failures"][0]["error"]


def test_a_variant_over_the_targets_limits_fails_the_gate_with_its_figures(tmp_path: Path) -> None:
    """A cubin that compiles but could not launch: a 64 x 512 by 512 x 256 fp16 dot stages over 320 KB of
    shared memory, past sm_90's 227 KiB and sm_80's 163 KiB a block. A small kernel beside it passes, and
    both kernels' registers, spills and shared memory are in the report."""
    package = tmp_path / "gate_limits"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "triton_wide.py").write_text(
        textwrap.dedent(
            """
            import torch, triton, triton.language as tl

            @triton.jit
            def _scale_kernel(x_ptr, N: tl.constexpr):
                offs = tl.arange(0, N)
                tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 2.0)

            @triton.jit
            def _wide_dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
                rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
                a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
                b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
                tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))

            def compile_gate_cases():
                yield lambda: _scale_kernel[(1,)](torch.empty(64, device="meta"), N=64)
                a = torch.empty(64, 512, dtype=torch.float16, device="meta")
                b = torch.empty(512, 256, dtype=torch.float16, device="meta")
                c = torch.empty(64, 256, device="meta")
                yield lambda: _wide_dot_kernel[(1,)](a, b, c, M=64, K=512, N=256)
            """
        )
    )
    rc, output, report = _run_gate(tmp_path, "--module", "gate_limits.triton_wide", pythonpath=str(tmp_path))
    assert rc == 1, output
    failures = {f["arch"]: f for f in report["failures"]}
    assert set(failures) == {80, 90}
    for arch, limit in ((90, 232_448), (80, 166_912)):
        failure = failures[arch]
        assert "_wide_dot_kernel" in failure["variant"] and failure["shared"] > limit
        assert f"shared memory {failure['shared']} B > {limit} B" in failure["error"]
        assert report["limits"][f"sm_{arch}"]["shared_bytes"] == limit
    figures = {(r["arch"], r["variant"].split("[")[0]): r for r in report["resources"]}
    assert len(figures) == 4
    small = figures[(90, "triton_wide._scale_kernel")]
    assert small["shared"] == 0 and small["n_spills"] == 0 and 0 < small["n_regs"] <= 255


def _variant(**features: str) -> Variant:
    items = tuple(features.items())
    return Variant("m.triton_x", "k", (), (), (), 4, 2, items)


def test_pairwise_cover_holds_every_pair() -> None:
    variants = [
        _variant(a=str(a), b=str(b), c=str(c), d="same") for a in range(4) for b in range(3) for c in range(2)
    ]
    chosen = pairwise_cover(variants)
    assert len(chosen) < len(variants)
    for f, g in (("a", "b"), ("a", "c"), ("b", "c")):
        wanted = {(dict(v.features)[f], dict(v.features)[g]) for v in variants}
        assert {(dict(v.features)[f], dict(v.features)[g]) for v in chosen} == wanted
