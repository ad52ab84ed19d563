"""Every knob's default is written once, in the settings tree; the layers below take it as an argument.

The tree is GatewaySettings (with EngineConfig, FairnessConfig, RoutingSettings and LedgerConfig under it),
EngineServerSettings and ClusterConfig. A dataclass field or a parameter anywhere in the packages that is
named like a knob and has a default of its own is a second copy of that default, and fails here, unless
it is listed below as a different thing that only shares the name.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel

from gateway.cluster_settings import ClusterConfig
from gateway.engine_server_settings import EngineServerSettings
from gateway.settings import GatewaySettings
from gateway.settings_flags import command_rows, knobs

TREES: tuple[type[BaseModel], ...] = (GatewaySettings, EngineServerSettings, ClusterConfig)
PACKAGES = (
    "fairserve_kernels",
    "fairness",
    "admission",
    "billing",
    "engine",
    "routing",
    "upstream",
    "gateway",
    "cluster",
)
# (module.qualname, name): why that default is not a copy of the knob's.
NAMESAKES: dict[tuple[str, str], str] = {
    ("engine.core.outputs.EngineStats", "max_num_batched_tokens"): "a measured snapshot, 0 until reported",
    ("engine.core.outputs.EngineStats", "max_num_seqs"): "a measured snapshot, 0 until reported",
    ("engine.core.outputs.EngineStats", "batch_size"): "a measured snapshot: the last iteration's batch",
    ("admission.quota.make_quota", "namespace"): "the Redis key prefix of quotas, not the Ray namespace",
    (
        "admission.quota_redis.RedisQuota",
        "namespace",
    ): "the Redis key prefix of quotas, not the Ray namespace",
    ("routing.score.Candidate", "max_num_seqs"): "an engine's reported seats, 0 until reported",
    ("engine.core.sampling_params.SamplingParams", "seed"): "a request's own sampling seed (OpenAI's `seed`)",
    ("sim.lift.BankedCreditSetup", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.lift.ClosedLoopSetup", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.scenarios.TwoTenantSetup", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.flows.FlowsSetup", "*"): "a simulated scenario's own values (docs/sim.md)",
    (
        "sim.flood.FloodSetup",
        "*",
    ): "a simulated scenario; its budgets are EngineConfig's, read from it",
    ("sim.locality.LocalitySetup", "*"): "a simulated scenario's own values (docs/fairness.md)",
    ("sim.flows.sybil", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.flows.fan_out", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.scenarios.scale_scenario", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.scenarios.scale_workload", "*"): "a simulated scenario's own values (docs/sim.md)",
    ("sim.spec.SimConfig", "*"): "a simulated engine (`fairserve sim` flags), not a served one",
    ("sim.cluster.ClusterConfig", "*"): "a simulated cluster (`fairserve sim --engines`)",
    (
        "sim.upstream.UpstreamSimConfig",
        "*",
    ): "a simulated upstream (`fairserve sim --scenario upstream`)",
    (
        "engine.serving.disagg.HandoffLoop",
        "kind",
    ): "the exception name a failed handoff reports, not --upstream-kind",
    ("gateway.settings_flags.knobs", "model"): "the tree class walked, not the model knob",
    ("gateway.settings_flags.add_knob_flags", "model"): "the tree class walked, not the model knob",
}


def tree_defaults() -> dict[str, Any]:
    """Leaf name -> default, over every tree."""
    return {
        knob.path[-1]: knob.field.get_default(call_default_factory=True)
        for tree in TREES
        for knob in knobs(tree)
    }


def _tree_nodes() -> set[type]:
    nodes: set[type] = set()

    def walk(model: type[BaseModel]) -> None:
        nodes.add(model)
        for info in model.model_fields.values():
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                walk(info.annotation)

    for tree in TREES:
        walk(tree)
    return nodes


def _modules() -> Iterator[Any]:
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if info.name.endswith("__main__"):
                continue
            try:
                yield importlib.import_module(info.name)
            except ModuleNotFoundError as exc:  # an optional extra (ray) that is not installed
                if exc.name is None or exc.name.split(".")[0] in PACKAGES:
                    raise


def _defaults_of(obj: Any) -> Iterator[tuple[str, Any]]:
    """(name, default) for each dataclass field and each parameter with a default."""
    functions: list[Callable[..., Any]] = []
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if f.default is not dataclasses.MISSING:
                    yield f.name, f.default
        functions = [v for v in vars(obj).values() if inspect.isfunction(v)]
    elif inspect.isfunction(obj):
        functions = [obj]
    for function in functions:
        for name, parameter in inspect.signature(function).parameters.items():
            if parameter.default is not inspect.Parameter.empty:
                yield name, parameter.default


def copies() -> list[str]:
    """Every default below the tree that repeats (or contradicts) a knob's, as `module.qualname.name = value`."""
    defaults, nodes, found = tree_defaults(), _tree_nodes(), []
    for module in _modules():
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__ or any(obj is node for node in nodes):
                continue
            where = f"{module.__name__}.{obj.__name__}" if hasattr(obj, "__name__") else ""
            for name, default in _defaults_of(obj):
                if name not in defaults or default is None:
                    continue  # None: "not given", the caller's value is used
                if (where, name) in NAMESAKES or (where, "*") in NAMESAKES:
                    continue
                found.append(f"{where}.{name} = {default!r} (tree: {defaults[name]!r})")
    return sorted(set(found))


def test_no_knob_default_is_written_below_the_tree() -> None:
    assert copies() == []


def test_the_scan_finds_a_copy_when_there_is_one(monkeypatch: Any) -> None:
    import fairness.vtc

    @dataclasses.dataclass
    class Shadow:
        lift_allowance: float = 1024.0

    Shadow.__module__ = "fairness.vtc"
    monkeypatch.setattr(fairness.vtc, "Shadow", Shadow, raising=False)
    assert copies() == ["fairness.vtc.Shadow.lift_allowance = 1024.0 (tree: 1024.0)"]


def test_config_show_lists_every_knob_of_the_tree() -> None:
    import argparse

    from gateway.settings_flags import effective_rows

    args = argparse.Namespace(config=None)
    listed = [key for key, _, _ in effective_rows(args)]
    expected = [knob.toml_key for knob in knobs(GatewaySettings)]
    expected += [
        knob.toml_key
        for knob in knobs(EngineServerSettings)
        if knob.path[0] not in GatewaySettings.model_fields
    ]
    expected += ["ray." + knob.toml_key for knob in knobs(ClusterConfig)]
    assert listed == expected
    assert {"ledger.batch_size", "ray.engines", "listen", "engine.fairness.max_queue_age_s"} <= set(listed)
    assert len(command_rows()) == len(expected) - len(list(knobs(GatewaySettings)))
