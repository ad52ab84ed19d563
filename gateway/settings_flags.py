"""Command-line flags generated from the settings tree, and where each effective value came from.

Hand-written on purpose: pydantic-settings' own CLI source names nested knobs `--engine.max_num_seqs`,
while fairserve's flags are the knob's leaf name (`--max-num-seqs`, `--policy`), which a GPU user reads
in every other server's docs. One walk over the model fields makes both the flags and `config show`.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from engine.config import KV_CACHE_FRACTION_BY_DEVICE
from fairness import POLICIES
from gateway.cluster_settings import ClusterConfig
from gateway.engine_server_settings import EngineServerSettings
from gateway.settings import GatewaySettings, raw_sources
from gateway.settings_base import ENV_NESTED_DELIMITER, ENV_PREFIX, LayeredSettings
from gateway.settings_help import ORDER, START, TITLES, help_order, metavar, section_of

S = TypeVar("S", bound=LayeredSettings)
# Leaf names that would read ambiguously as a bare flag get a qualified one.
_QUALIFIED: dict[tuple[str, ...], str] = {
    ("engine", "fairness", "key"): "--fairness-key",
    # The engine's Redis (shared VTC counters) beside the gateway's own --redis (quotas, idempotency) in `serve`;
    # in `fairserve engine`, whose tree is EngineConfig alone, it is the only Redis and takes the short name.
    ("engine", "redis_url"): "--engine-redis",
    ("redis_url",): "--redis",
    # `serve --model` repeats (models.local_models: one local engine per model); `fairserve engine` keeps it.
    ("engine", "model"): "--engine-model",
}
# Knobs whose flag `serve` accepts but does not show: another flag says the same to a reader. `--model DIR`
# given once is the engine's model (gateway/model_settings.py), so `--engine-model` would be a second name
# for one thing; it stays accepted for the scripts that use it.
_SUPERSEDED = {("engine", "model")}
# Subtrees whose flags carry the subtree's name (`--ledger-batch-size`): their leaf names say too little alone.
_PREFIXED = {"ledger", "upstream"}
# Choices that come from a registry rather than a Literal type.
_REGISTRY_CHOICES = {("engine", "fairness", "policy"): lambda: list(POLICIES)}


@dataclass(frozen=True)
class Knob:
    """One leaf of the settings tree: its path, field, flags and environment variable."""

    path: tuple[str, ...]
    field: FieldInfo

    @property
    def dest(self) -> str:
        return "knob__" + "__".join(self.path)

    @property
    def flags(self) -> list[str]:
        """The flag names, the field's own `flags` (short, human names) first, then the leaf name."""
        leaf = self.path[-1] if self.path[0] not in _PREFIXED else "_".join(self.path)
        derived = _QUALIFIED.get(self.path, "--" + leaf.replace("_", "-"))
        extra = self.field.json_schema_extra
        flags = extra.get("flags", []) if isinstance(extra, dict) else []
        named = [str(flag) for flag in flags] if isinstance(flags, list) else []
        return [*named, derived]

    @property
    def env(self) -> str:
        return ENV_PREFIX + ENV_NESTED_DELIMITER.join(self.path).upper()

    @property
    def toml_key(self) -> str:
        return ".".join(self.path)


def knobs(model: type[BaseModel] = GatewaySettings, prefix: tuple[str, ...] = ()) -> Iterator[Knob]:
    """Every leaf field of the tree, depth first in declaration order."""
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from knobs(annotation, (*prefix, name))
        else:
            yield Knob((*prefix, name), info)


def _scalar(annotation: Any) -> tuple[Any, list[Any] | None]:
    """The argparse type and choices for a field's annotation (Optional unwrapped)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in args if a is not type(None))
        args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list:
        return _scalar(args[0])
    if typing.get_origin(annotation) is Literal:
        return type(args[0]), list(args)
    if annotation in (int, float):
        return annotation, None
    return str, None


def add_knob_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel] = GatewaySettings,
    aliases: dict[str, str] | None = None,
) -> None:
    """One flag per knob of `model`, in the help sections of gateway/settings_help.py; unset flags stay out
    of the namespace so lower sources can fill them.

    A knob's first flag is the one its help shows; its other spellings (`--local-models`, `--grace-period-s`,
    `serve --engine-model`) are accepted and hidden, so scripts written against them keep working.
    `aliases` maps a leaf name to one more flag for it in this command only (`fairserve engine` gives
    an engine's `redis_url` the `--redis` that `serve` spends on the gateway's own Redis).
    """
    groups = {name: parser.add_argument_group(TITLES[name]) for name in ORDER}
    groups[START].add_argument(
        "--config", type=Path, default=None, metavar="FILE", help="TOML file of settings"
    )
    seen: set[str] = set()
    for knob in sorted(knobs(model), key=lambda k: help_order(k.path)):  # stable: the tree order otherwise
        flags = list(dict.fromkeys(knob.flags))  # `--redis` is both redis_url's own name and its derived one
        alias = (aliases or {}).get(knob.path[-1])
        if alias is not None and alias not in flags and alias not in seen:
            flags = [alias, *flags]
        clash = seen.intersection(flags)
        if clash:
            raise RuntimeError(f"settings flag {clash} defined twice: qualify it in _QUALIFIED")
        seen.update(flags)
        superseded = knob.path in _SUPERSEDED and alias is None
        help_ = f"{knob.field.description or knob.toml_key} [{knob.env}; default {_default_text(knob)}]"
        group = groups[section_of(knob.path)]
        if knob.field.annotation is bool:
            group.add_argument(
                *flags[-1:],
                dest=knob.dest,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=argparse.SUPPRESS if superseded else help_,
            )
            continue
        kind, choices = _scalar(knob.field.annotation)
        choices = _REGISTRY_CHOICES[knob.path]() if knob.path in _REGISTRY_CHOICES else choices
        # e.g. --engine A --engine B; a dict knob is repeated NAME=VALUE (--lora a=/p --lora b=/q)
        repeated = typing.get_origin(knob.field.annotation) in (list, dict)
        spec: dict[str, Any] = {
            "dest": knob.dest,
            "type": kind,
            "choices": choices,
            "default": argparse.SUPPRESS,
            "action": "append" if repeated else "store",
            "metavar": None if choices else metavar(knob.path[-1], kind),
        }
        shown, hidden = ([], flags) if superseded else (flags[:1], flags[1:])
        if shown:
            group.add_argument(*shown, help=help_, **spec)
        if hidden:
            group.add_argument(*hidden, help=argparse.SUPPRESS, **spec)


def _default_text(knob: Knob) -> str:
    if knob.path == ("engine", "kv_cache_memory_fraction"):
        return " / ".join(f"{v} on {k}" for k, v in KV_CACHE_FRACTION_BY_DEVICE.items())
    if knob.path == ("engine", "cache_dir"):
        return "<data_dir>/models"
    default = knob.field.get_default(call_default_factory=True)
    return "none" if default is None else str(default)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs set on the command line, as the nested dict GatewaySettings.load takes."""
    nested: dict[str, Any] = {}
    for name, value in vars(args).items():
        if not name.startswith("knob__"):
            continue
        *parents, leaf = name.removeprefix("knob__").split("__")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """The effective settings for parsed flags (ValidationError / ValueError on bad values)."""
    return GatewaySettings.load(flags_from_args(args), args.config)


def load_from_args(args: argparse.Namespace, model: type[S]) -> S:
    """Another command's settings tree (e.g. `fairserve engine`'s) for its parsed flags."""
    return model.load(flags_from_args(args), args.config)


def _lookup(tree: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = tree
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def effective_rows(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(key, effective value, source) for every knob, the source being flag, env, file or default."""
    settings = settings_from_args(args)
    layers = [("flag", flags_from_args(args)), *raw_sources(args.config).items()]
    rows = []
    for knob in knobs():
        value: Any = settings
        for part in knob.path:
            value = getattr(value, part)
        source = next((label for label, tree in layers if _lookup(tree, knob.path)[0]), "default")
        source = {
            "flag": f"flag {knob.flags[0]}",
            "env": f"env {knob.env}",
            "file": f"file {args.config}",
        }.get(source, source)
        if knob.path == ("engine", "kv_cache_memory_fraction") and value is None:
            value, source = settings.engine.kv_fraction(), f"default for device {settings.engine.device}"
        elif knob.path == ("engine", "cache_dir") and source == "default":
            source = "default: <data_dir>/models"
        rows.append((knob.toml_key, "none" if value is None else str(value), source))
    return rows + command_rows()


def command_rows() -> list[tuple[str, str, str]]:
    """The knobs of the tree that `serve` does not read: `fairserve engine`'s own and `fairserve ray`'s.

    Their values come from the environment or the default (each command reads its own flags and file).
    """
    rows = []
    trees: list[tuple[BaseSettings, tuple[str, ...], str]] = [
        (EngineServerSettings(), (), "fairserve engine"),
        (ClusterConfig(), ("ray",), "fairserve ray"),
    ]
    for tree, prefix, command in trees:
        for knob in knobs(type(tree)):
            if not prefix and knob.path[0] in GatewaySettings.model_fields:
                continue  # shared with serve: listed above
            value: Any = tree
            for part in knob.path:
                value = getattr(value, part)
            env = ENV_PREFIX + ENV_NESTED_DELIMITER.join((*prefix, *knob.path)).upper()
            source = f"env {env}" if env in os.environ else "default"
            key = ".".join((*prefix, *knob.path))
            rows.append((key, "none" if value is None else str(value), f"{source} ({command})"))
    return rows
