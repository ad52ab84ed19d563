"""Compile every Triton kernel variant for the GPUs it is for, on any machine: the gate `make test` runs.

Triton's interpreter (TRITON_INTERPRET=1, what CPU tests run) executes a kernel's Python; it is not
the compiler, and accepts code the compiler refuses (a module-level float read inside a kernel ran
in every CPU test and failed every request on the first GPU). Triton's compiler itself needs no GPU:
given a target it lowers a kernel to PTX and, through the ptxas its wheel ships, to a cubin.

Variants come from the launch code itself. Each `fairserve_kernels.triton_*` module exposes
`compile_gate_cases()`: zero-argument calls of its public launchers on "meta" tensors over the
inputs the engine can produce (dtypes, head dims, GQA groups, block sizes, batch shapes). A fake
CUDA driver makes Triton bind those launches for a target without a device, and its
`jit_cache_hook` hands over each specialisation (signature, constexprs, alignment attributes,
options) instead of launching. So whatever the heuristics pick (split counts, tiles, warps) is what
gets compiled, and a new heuristic branch is covered without editing this file.

Every distinct variant is compiled with `--all` (the GPU check does, on its 16 cores). On this
project's 2-core CI that is too slow, so the default compiles a covering subset: every value each
specialised parameter takes, and every pair of values two parameters take together, appears in at
least one compiled variant (greedy pairwise cover). Both report how many variants exist.

A cubin that compiles can still fail to launch, or crawl: each compiled variant's dynamic shared memory
(Triton's `metadata.shared`), registers per thread and spilled words (what Triton's `n_regs` and `n_spills`
read from the driver at load: the function's register count and local memory / 4, here read from the cubin
with the `cuobjdump` Triton's wheel ships, as there is no driver) are held to the target's limits
(`LIMITS`: shared memory and registers; spills are reported, not yet failed); a variant over them is a
failure, and every variant's figures are in the report.
"""

from __future__ import annotations

import argparse
import heapq
import importlib
import itertools
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fairserve_kernels.launch_heuristics import DEFAULT_SM_COUNT, SHARED_BYTES, assume_gpu

# (compute capability, the SM count the launch heuristics see): H100/H200 and A100.
TARGETS: dict[int, int] = {90: 132, 80: 108}
WARP_SIZE = 32


@dataclass(frozen=True)
class Limits:
    """What one block may use on a target (CUDA's per-compute-capability limits), and our spill budget."""

    shared_bytes: int  # dynamic shared memory per block, opted in to the maximum
    regs_per_thread: int = 255
    regs_per_block: int = 65536
    # Spills slow a kernel but do not stop it launching: reported, and a failure only where a budget is set
    # (None: not yet, until the whole gate's figures show which variants spill).
    spilled_words: int | None = None


# sm_90 (H100/H200): 227 KiB of shared memory per block; sm_80 (A100): 163 KiB.
LIMITS: dict[int, Limits] = {arch: Limits(shared_bytes=shared) for arch, shared in SHARED_BYTES.items()}


@dataclass(frozen=True)
class Resources:
    """What one compiled variant uses: Triton's `n_regs`, `n_spills` (words) and `metadata.shared` (bytes)."""

    n_regs: int
    n_spills: int
    shared: int

    def over(self, limits: Limits, num_warps: int) -> list[str]:
        """Each limit this variant exceeds, with both figures (empty: it fits)."""
        found = []
        if self.shared > limits.shared_bytes:
            found.append(f"shared memory {self.shared} B > {limits.shared_bytes} B")
        if self.n_regs > limits.regs_per_thread:
            found.append(f"{self.n_regs} registers a thread > {limits.regs_per_thread}")
        if self.n_regs * num_warps * WARP_SIZE > limits.regs_per_block:
            found.append(
                f"{self.n_regs} registers x {num_warps * WARP_SIZE} threads > {limits.regs_per_block} a block"
            )
        if limits.spilled_words is not None and self.n_spills > limits.spilled_words:
            found.append(f"{self.n_spills} spilled words > {limits.spilled_words}")
        return found


_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def cubin_resources(cubin: bytes, shared: int) -> Resources:
    """Registers and local memory of the cubin's one function (`cuobjdump -res-usage`), and the dynamic
    shared memory Triton sized for it (static shared, which Triton does not use, is added)."""
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "-res-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    usage = _USAGE.search(listing)
    if usage is None:
        raise RuntimeError(f"no resource usage in cuobjdump's listing: {listing[:200]!r}")
    regs, _, static_shared, local = (int(g) for g in usage.groups())
    return Resources(n_regs=regs, n_spills=local // 4, shared=shared + static_shared)


@dataclass(frozen=True)
class Variant:
    """One specialisation of one kernel, as Triton would compile it at a launch."""

    module: str
    kernel: str
    signature: tuple[tuple[str, str], ...]
    constants: tuple[tuple[tuple[int, ...], Any], ...]
    attrs: tuple[tuple[tuple[int, ...], tuple[tuple[str, int], ...]], ...]
    num_warps: int
    num_stages: int
    features: tuple[tuple[str, str], ...] = field(compare=False)

    @property
    def name(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.kernel}"

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.features)
        return f"{self.name}[{shown}]"


class _FakeDriver:
    """Just enough of a Triton driver for binding a launch to `target` on a machine without that GPU."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> str:
        return f"compile-gate-sm{self.target.arch}"

    def get_current_stream(self, device: object = None) -> int:
        return 0

    def is_active(self) -> bool:
        return True


def _gpu_target(arch: int) -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, WARP_SIZE)


@contextmanager
def _bound_to(arch: int, captured: dict[Any, Variant]) -> Iterator[None]:
    """Within: Triton launches bind for `arch` and land in `captured` instead of running."""
    from triton import knobs
    from triton.runtime.driver import driver

    def hook(*, key: Any, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        jit = fn.jit_function
        if key not in captured:
            captured[key] = _variant(jit, compile)
        return True  # handled: Triton neither compiles nor launches

    previous, previous_driver = knobs.runtime.jit_cache_hook, driver._active
    driver.set_active(_FakeDriver(_gpu_target(arch)))
    knobs.runtime.jit_cache_hook = hook
    try:
        yield
    finally:
        knobs.runtime.jit_cache_hook = previous
        driver._active = previous_driver  # not reset_active(): without a GPU there is no default driver


def _variant(jit: Any, compile: dict[str, Any]) -> Variant:
    signature = tuple(compile["signature"].items())
    names = [name for name, _ in signature]
    constants = tuple(sorted(compile["constants"].items()))
    attrs = tuple(
        sorted(
            (path, tuple((str(a), int(b)) for a, b in spec)) for path, spec in compile["configs"][0].items()
        )
    )
    features = [(f"dtype:{n}", t) for n, t in signature if t.startswith("*")]
    features += [(names[path[0]], str(value)) for path, value in constants]
    features += [("num_warps", str(compile["num_warps"])), ("num_stages", str(compile["num_stages"]))]
    return Variant(
        module=jit.fn.__module__,
        kernel=jit.fn.__qualname__,
        signature=signature,
        constants=constants,
        attrs=attrs,
        num_warps=int(compile["num_warps"]),
        num_stages=int(compile["num_stages"]),
        features=tuple(features),
    )


def kernel_modules() -> list[str]:
    """Every `fairserve_kernels.triton_*` module: each must expose `compile_gate_cases()`."""
    import fairserve_kernels

    return sorted(
        f"fairserve_kernels.{m.name}"
        for m in pkgutil.iter_modules(fairserve_kernels.__path__)
        if m.name.startswith("triton_")
    )


def collect_variants(
    arch: int, modules: Iterable[str], cases_of: str = "compile_gate_cases"
) -> list[Variant]:
    """Run every module's gate cases bound to `arch`; the distinct variants their launches asked for.
    `cases_of`: "compile_gate_required" for the cases a module wants compiled whatever the cover picks
    (optional, unlike `compile_gate_cases`)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("the compile gate needs Triton's compiler: unset TRITON_INTERPRET")
    captured: dict[Any, Variant] = {}
    with _bound_to(arch, captured), assume_gpu(arch, TARGETS.get(arch, DEFAULT_SM_COUNT)):
        for name in modules:
            module = importlib.import_module(name)
            cases: Callable[[], Iterable[Callable[[], object]]] | None = getattr(module, cases_of, None)
            if cases is None and cases_of != "compile_gate_cases":
                continue
            if cases is None:
                raise RuntimeError(f"{name} defines Triton kernels but no compile_gate_cases()")
            for case in cases():
                case()
    return sorted(set(captured.values()), key=lambda v: (v.name, v.features))


def pairwise_cover(variants: list[Variant]) -> list[Variant]:
    """A subset in which every (parameter=value) pair, and every pair of them, of each kernel appears.

    Greedy set cover: repeatedly take the variant covering most uncovered pairs. Only parameters whose
    value varies between a kernel's variants matter; the rest appear in every variant.
    """
    chosen: list[Variant] = []
    by_kernel: dict[str, list[Variant]] = {}
    for variant in variants:
        by_kernel.setdefault(variant.name, []).append(variant)
    for group in by_kernel.values():
        varying = {k for k, _ in group[0].features if len({dict(v.features)[k] for v in group}) > 1}

        def pairs(v: Variant, varying: set[str] = varying) -> set[tuple[tuple[str, str], ...]]:
            items = sorted(kv for kv in v.features if kv[0] in varying)
            return {(a,) for a in items} | set(itertools.combinations(items, 2))

        candidates = [(v, pairs(v)) for v in group]
        uncovered = set().union(*(p for _, p in candidates))
        chosen.append(candidates[0][0])  # one variant even where nothing varies
        uncovered -= candidates[0][1]
        # Lazy greedy: a candidate's gain only falls as pairs get covered, so a stale gain is an upper
        # bound and only the heap's top needs recounting (18k attention variants: seconds, not minutes).
        heap = [(-len(p & uncovered), i) for i, (_, p) in enumerate(candidates)]
        heapq.heapify(heap)
        while uncovered and heap:
            _, i = heapq.heappop(heap)
            gain = len(candidates[i][1] & uncovered)
            if gain == 0:
                continue
            if heap and gain < -heap[0][0]:
                heapq.heappush(heap, (-gain, i))
                continue
            chosen.append(candidates[i][0])
            uncovered -= candidates[i][1]
    return chosen


def compile_variant(
    arch: int, variant: Variant, options: dict[str, Any] | None = None
) -> tuple[str, float, int, Resources]:
    """Compile one variant to a cubin for sm_`arch`: (description, seconds, cubin bytes, resources).
    Raises on failure."""
    import triton
    from triton.compiler import ASTSource

    module = importlib.import_module(variant.module)
    jit = getattr(module, variant.kernel)
    attrs = {path: [list(a) for a in spec] for path, spec in variant.attrs}
    source = ASTSource(jit, dict(variant.signature), dict(variant.constants), attrs)
    start = time.perf_counter()
    compiled = triton.compile(
        source,
        target=_gpu_target(arch),
        options={"num_warps": variant.num_warps, "num_stages": variant.num_stages, **(options or {})},
    )
    cubin = compiled.asm.get("cubin")
    if not cubin:
        raise RuntimeError(f"{variant.describe()}: no cubin for sm_{arch}")
    used = cubin_resources(cubin, int(compiled.metadata.shared))
    return variant.describe(), time.perf_counter() - start, len(cubin), used


def _compile_job(job: tuple[int, Variant]) -> dict[str, Any]:
    arch, variant = job
    try:
        described, seconds, size, used = compile_variant(arch, variant)
    except Exception as exc:  # a compile failure is the gate's finding: report it with its variant
        return {
            "arch": arch,
            "variant": variant.describe(),
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
        }
    over = used.over(LIMITS[arch], variant.num_warps) if arch in LIMITS else []
    return {
        "arch": arch,
        "variant": described,
        "ok": not over,
        "seconds": round(seconds, 3),
        "cubin_bytes": size,
        "n_regs": used.n_regs,
        "n_spills": used.n_spills,
        "shared": used.shared,
        "num_warps": variant.num_warps,
        **({"error": f"over the sm_{arch} limits: " + "; ".join(over)} if over else {}),
    }


def _values(variants: list[Variant]) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = {}
    for v in variants:
        for key, value in v.features:
            seen.setdefault(key, set()).add(value)
    return {key: sorted(values) for key, values in seen.items() if len(values) > 1}


def _collect_arch(job: tuple[int, list[str]]) -> tuple[list[Variant], list[Variant]]:
    arch, modules = job
    return collect_variants(arch, modules), collect_variants(arch, modules, "compile_gate_required")


def _collect_all(
    archs: list[int], modules: list[str], jobs: int
) -> dict[int, tuple[list[Variant], list[Variant]]]:
    """Every arch's variants and required variants; one process per arch with `jobs` > 1 (enumerating the
    launches is a minute of Python per arch)."""
    work = [(arch, modules) for arch in archs]
    if jobs > 1 and len(archs) > 1:
        with ProcessPoolExecutor(min(jobs, len(archs))) as pool:
            return dict(zip(archs, pool.map(_collect_arch, work), strict=True))
    return {arch: _collect_arch(job) for arch, job in zip(archs, work, strict=True)}


def run_gate(archs: list[int], modules: list[str], every_variant: bool, jobs: int) -> dict[str, Any]:
    """Collect, select and compile; the report `main` prints and writes.

    Per arch and kernel: how many variants the launches asked for, how many were compiled, and the
    values each varying parameter took among all variants and among the compiled ones.
    """
    report: dict[str, Any] = {"archs": {}, "failures": []}
    work: list[tuple[int, Variant]] = []
    collected = _collect_all(archs, modules, jobs)
    for arch in archs:
        variants, required = collected[arch]
        variants = sorted(set(variants) | set(required), key=lambda v: (v.name, v.features))
        cover = pairwise_cover(variants)
        selected = variants if every_variant else cover + [v for v in required if v not in set(cover)]
        kernels: dict[str, Any] = {}
        for name in sorted({v.name for v in variants}):
            everything = [v for v in variants if v.name == name]
            compiled = [v for v in selected if v.name == name]
            kernels[name] = {
                "variants": len(everything),
                "compiled": len(compiled),
                "values": _values(everything),
                "compiled_values": {
                    k: sorted({dict(v.features)[k] for v in compiled}) for k in _values(everything)
                },
            }
        report["archs"][f"sm_{arch}"] = kernels
        work += [(arch, v) for v in selected]
    start = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_compile_job, work))
    else:
        results = [_compile_job(job) for job in work]
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["compiled"] = sum(r["ok"] for r in results)
    report["failures"] = [r for r in results if not r["ok"]]
    report["limits"] = {f"sm_{arch}": vars(LIMITS[arch]) for arch in archs if arch in LIMITS}
    report["resources"] = [
        {k: r[k] for k in ("arch", "variant", "n_regs", "n_spills", "shared", "num_warps")}
        for r in results
        if "n_regs" in r
    ]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=sorted(TARGETS, reverse=True))
    parser.add_argument(
        "--module", nargs="+", help="kernel modules (default: every fairserve_kernels.triton_*)"
    )
    parser.add_argument("--all", action="store_true", help="every distinct variant, not the pairwise cover")
    parser.add_argument("--jobs", type=int, default=1, help="compiler processes")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = run_gate(args.arch, args.module or kernel_modules(), args.all, args.jobs)
    for arch, kernels in report["archs"].items():
        for name, counts in kernels.items():
            print(f"{arch} {name}: {counts['compiled']} of {counts['variants']} variants compiled")
    worst: dict[tuple[int, str], list[int]] = {}
    for used in report["resources"]:
        top = worst.setdefault((used["arch"], used["variant"].split("[")[0]), [0, 0, 0])
        top[:] = [
            max(a, b) for a, b in zip(top, (used["shared"], used["n_regs"], used["n_spills"]), strict=True)
        ]
    for (arch, name), (shared, regs, spills) in sorted(worst.items()):
        print(f"sm_{arch} {name}: at most {shared} B shared, {regs} registers, {spills} spilled words")
    for failure in report["failures"]:
        print(f"FAILED sm_{failure['arch']} {failure['variant']}: {failure['error']}", file=sys.stderr)
    print(f"{report['compiled']} cubins in {report['seconds']} s, {len(report['failures'])} failures")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
