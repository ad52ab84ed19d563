"""The runner, the scheduler and the engine are whole when built (issue 55, point 4).

Each gets its collaborators in its constructor (engine/worker/model_runner.py `RunnerParts`, the scheduler's
`slots` and `swap`), in the order the engine starts: the KV cache, then the decode graphs' capture. No code
assigns an attribute of one of them from outside; the test reads every module of the product for such an
assignment, so a new one fails here rather than leaving a reader of `__init__` with half the picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

from engine import EngineConfig, LLMEngine
from engine.worker.loader import load_model

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["engine", "sim", "gateway", "routing", "upstream", "cluster", "bench", "experiments"]
# The names a runner, a scheduler or an engine goes by, bare (`runner.graphs = ...`) or as another object's
# attribute (`self.scheduler.swap_out = ...`). An engine is named so only inside engine/ (the simulator's
# cluster keeps records of its own called `engine`).
HELD = {"runner", "scheduler"}
ENGINE_NAMES = {"engine", "llm_engine", "inner"}


def assignments_from_outside(source: str, engine_package: bool) -> list[str]:
    """`X.attr = ...` (or `+=`, or annotated) where X is a runner, a scheduler or (in engine/) an engine
    that is not `self`: the targets, as written."""
    held = HELD | ENGINE_NAMES if engine_package else HELD
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in _flat(target)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            named = (isinstance(owner, ast.Name) and owner.id in held) or (
                isinstance(owner, ast.Attribute) and owner.attr in held
            )
            if named:
                found.append(ast.unparse(target))
    return found


def _flat(target: ast.expr) -> list[ast.expr]:
    return [t for e in target.elts for t in _flat(e)] if isinstance(target, ast.Tuple) else [target]


def test_the_check_finds_each_kind_of_assignment_from_outside() -> None:
    found = assignments_from_outside(
        "runner.graphs = None\n"
        "self.scheduler.swap_out, self.scheduler.swap_in = a, b\n"
        "engine.front_detokenizes = True\n"
        "self.runner.lora: object = x\n"
        "scheduler.iteration += 1\n"
        "self.graphs = None\n",  # its own attribute: not from outside
        engine_package=True,
    )
    assert found == [
        "runner.graphs",
        "self.scheduler.swap_out",
        "self.scheduler.swap_in",
        "engine.front_detokenizes",
        "self.runner.lora",
        "scheduler.iteration",
    ]
    assert assignments_from_outside("engine.busy = True\n", engine_package=False) == []


def test_no_module_of_the_product_assigns_a_runner_scheduler_or_engine_attribute() -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if (found := assignments_from_outside(path.read_text(), package == "engine"))
    }
    assert offenders == {}


def test_a_built_engine_hands_its_parts_their_collaborators() -> None:
    loaded = load_model(None, dtype="auto", device="cpu")
    engine = LLMEngine(EngineConfig(num_kv_blocks=32, preemption_mode="swap"), loaded=loaded)
    assert engine.runner.lora is engine.lora and engine.scheduler.slots is engine.lora
    assert engine.runner.grammar is not None and engine.grammar.masks is engine.runner.grammar
    assert engine.scheduler.swap is not None
    graphs = engine.runner.graphs  # captured last, in the constructor, over the cache it allocated
    assert graphs is not None and graphs.bound_to(engine.runner.kv_caches)
