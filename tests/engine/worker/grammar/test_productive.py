"""A schema with a part no finite value completes is refused at compile (engine/worker/grammar/productive.py): a
self-reference, a `$defs` cycle, a required item or property that refers back; recursive schemas with a way
out are served. The check walks without recursion, whatever the depth."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.core.sampling_params import Grammar
from engine.worker.grammar.backend import GrammarError, embedded_schemas, grammar_text
from engine.worker.grammar.productive import Unproductive, check_productive

CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
UNPRODUCTIVE: dict[str, tuple[Any, str]] = {
    "itself": ({"$ref": "#"}, "the root"),
    "defs cycle": (CYCLE, "the root"),
    "required item": ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "the root"),
    "required prefix item": ({"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1}, "the root"),
    "required property": (
        {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
        "the root",
    ),
    "optional property to a cycle": (
        {
            "type": "object",
            "properties": {"y": {"$ref": "#/$defs/bad"}},
            "$defs": {"bad": {"$ref": "#/$defs/bad"}},
        },
        "/properties/y",
    ),
    "all of itself": ({"allOf": [{"$ref": "#"}]}, "the root"),
    "escaped pointer": ({"$defs": {"a/b": {"$ref": "#/$defs/a~1b"}}, "$ref": "#/$defs/a~1b"}, "the root"),
    "required and forbidden": (
        {
            "type": "object",
            "properties": {"a": {"type": "string"}},
            "required": ["b"],
            "additionalProperties": False,
        },
        "the root",
    ),
}
PRODUCTIVE: dict[str, Any] = {
    "nested arrays": {"type": "array", "items": {"$ref": "#"}},
    "optional self": {"type": "object", "properties": {"x": {"$ref": "#"}}},
    "linked list": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}},
                "required": ["next"],
            }
        },
        "$ref": "#/$defs/n",
    },
    "tree": {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["children"],
    },
    "closed object": {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "a remote ref (llguidance's to judge)": {"$ref": "https://example.invalid/s.json"},
    "true": True,
}


@pytest.mark.parametrize("name", list(UNPRODUCTIVE))
def test_a_schema_that_cannot_be_completed_is_refused_naming_where(name: str) -> None:
    schema, where = UNPRODUCTIVE[name]
    with pytest.raises(Unproductive, match=f"at {where} can never be completed"):
        check_productive(schema)
    with pytest.raises(GrammarError, match="can never be completed"):  # the compile's refusal
        grammar_text(Grammar("json_schema", json.dumps(schema)))


@pytest.mark.parametrize("name", list(PRODUCTIVE))
def test_a_recursive_schema_with_a_way_out_is_served(name: str) -> None:
    check_productive(PRODUCTIVE[name])


def test_a_tool_grammar_embedding_a_cycle_is_refused() -> None:
    lark = "\n".join(
        [
            "start: call",
            "call: call_0",
            'call_0: "<c>" args_0 "</c>"',
            f"args_0: %json {json.dumps({'type': 'object', 'properties': {'x': {'$ref': '#'}}, 'required': ['x']})}",
        ]
    )
    assert len(embedded_schemas(lark)) == 1
    with pytest.raises(GrammarError, match="can never be completed"):
        grammar_text(Grammar("lark", lark, "tools"))


def test_depth_does_not_recurse() -> None:
    """Five thousand nested `items` (and a cycle at the bottom), five times the interpreter's recursion limit:
    checked with explicit stacks."""
    deep: dict[str, Any] = {"type": "array", "minItems": 1}
    node = deep
    for _ in range(5_000):
        node["items"] = {"type": "array", "minItems": 1}
        node = node["items"]
    node["items"] = {"type": "string"}
    check_productive(deep)
    node["items"] = {"$ref": "#"}  # now every level requires the next, forever
    with pytest.raises(Unproductive):
        check_productive(deep)
