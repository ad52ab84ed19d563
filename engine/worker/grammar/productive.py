"""Whether every part of a JSON schema can be completed: refused at compile, not failed at mask time.

A schema can describe values no output can finish: `{"$ref": "#"}` (itself, forever), a `$defs` cycle, an
array whose required first item is the array itself, a required property that refers back to its object.
llguidance compiles such a schema, then a mask finds no way on ("NoExtensionBias", or "Too many items" while
it expands forced tokens), mid-request (issue 54). So before the compile every schema node reachable from
the root is checked for productivity: whether some finite JSON value satisfies it. Any reachable object
schema that cannot be satisfied, the root included, refuses the grammar with the JSON pointer of the first
one (a 400 naming the grammar's field). A bare `false` is not refused where it stands (an optional property
or `additionalProperties: false` forbids, and the model simply cannot go there).

Productivity is a least fixpoint over AND/OR gates (unit propagation over the gates' inputs), linear in the
schema's nodes and edges, and walked with explicit stacks: no recursion, whatever the nesting depth. The
rules are JSON Schema's, made stricter where llguidance may be (a node without `type` counts as the types
its keywords imply), so what passes here is productive for llguidance too. Why hand-written: neither
llguidance nor a maintained JSON-schema library reports an unproductive reference before generation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

OBJECT_KEYS = ("properties", "required", "additionalProperties", "patternProperties", "minProperties")
ARRAY_KEYS = ("items", "prefixItems", "minItems", "additionalItems")
ALL_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


class Unproductive(ValueError):
    """A schema with a part no finite value satisfies; the message names its JSON pointer."""


@dataclass
class _Gate:
    """A node of the AND/OR circuit: AND fires when all inputs fired, OR when any did."""

    any_of: bool
    inputs: int = 0
    fired: bool = False
    outputs: list[int] = field(default_factory=list)


class _Circuit:
    def __init__(self) -> None:
        self.gates: list[_Gate] = []

    def gate(self, any_of: bool, inputs: list[int]) -> int:
        """A new gate over `inputs` (an AND of none is true, an OR of none false)."""
        index = len(self.gates)
        self.gates.append(_Gate(any_of, len(inputs)))
        for i in inputs:
            self.gates[i].outputs.append(index)
        return index

    def solve(self) -> None:
        """Fire every gate that fires: start from the true ones, push to their outputs."""
        ready = deque(i for i, g in enumerate(self.gates) if not g.any_of and g.inputs == 0)
        while ready:
            i = ready.popleft()
            gate = self.gates[i]
            if gate.fired:
                continue
            gate.fired = True
            for j in gate.outputs:
                out = self.gates[j]
                out.inputs -= 1
                if not out.fired and (out.any_of or out.inputs == 0):
                    ready.append(j)


def check_productive(schema: Any) -> None:
    """Raise Unproductive if the schema, or an object schema reachable from it, admits no finite value."""
    builder = _Builder(schema)
    builder.build()
    builder.circuit.solve()
    for pointer in builder.order:
        node = builder.nodes[pointer]
        if isinstance(node, dict) and not builder.circuit.gates[builder.index[pointer]].fired:
            where = pointer or "the root"
            raise Unproductive(
                f"the schema at {where} can never be completed: no finite value satisfies it "
                "(a reference back to itself, or a required part that cannot exist)"
            )


class _Builder:
    """The gate of every schema node reachable from the root, by JSON pointer."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.circuit = _Circuit()
        self.nodes: dict[str, Any] = {}
        self.index: dict[str, int] = {}  # pointer -> its node's gate (an OR over the node's "ways")
        self.order: list[str] = []  # pointers in the order first reached (root first)
        self._pending: list[tuple[int, list[str]]] = []  # (AND gate, the node pointers it needs)

    def build(self) -> None:
        stack = [""]
        self._reach("", self.root)
        while stack:
            pointer = stack.pop()
            for child in self._expand(pointer, self.nodes[pointer]):
                if child[0] not in self.nodes:
                    self._reach(*child)
                    stack.append(child[0])
        for gate, needs in self._pending:  # wire each node's requirements once every node has a gate
            for pointer in needs:
                self.circuit.gates[self.index[pointer]].outputs.append(gate)
                self.circuit.gates[gate].inputs += 1

    def _reach(self, pointer: str, node: Any) -> None:
        self.nodes[pointer] = node
        self.order.append(pointer)
        # Placeholder: the node's OR gate, filled by `_expand` (its ways are AND gates feeding it).
        self.index[pointer] = self.circuit.gate(True, [])

    def _way(self, node_gate: int, needs: list[str], constant: bool | None = None) -> None:
        """One way for the node to be satisfied: all of `needs` (constant False: no way)."""
        if constant is False:
            return
        way = self.circuit.gate(False, [])
        self._pending.append((way, needs))
        self.circuit.gates[way].outputs.append(node_gate)
        self.circuit.gates[node_gate].inputs += 1

    def _expand(self, pointer: str, node: Any) -> list[tuple[str, Any]]:
        """Add the node's ways to its gate; the child nodes (pointer, schema) it reaches."""
        gate = self.index[pointer]
        if node is False:
            return []
        if not isinstance(node, dict):
            self._way(gate, [])  # true, or not a schema (llguidance reports that itself)
            return []
        children: list[tuple[str, Any]] = []
        common: list[str] = []  # what every way needs: $ref, allOf, anyOf / oneOf
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = self._resolve(ref)
            if target is not None:
                children.append(target)
                common.append(target[0])
        for key in ("allOf",):
            for i, sub in enumerate(_listed(node.get(key))):
                children.append((f"{pointer}/{key}/{i}", sub))
                common.append(f"{pointer}/{key}/{i}")
        for key in ("anyOf", "oneOf"):
            subs = _listed(node.get(key))
            if isinstance(node.get(key), list):
                either = f"{pointer}/{key}"
                self.nodes[either] = node[key]
                self.index[either] = self.circuit.gate(True, [])
                for i, sub in enumerate(subs):
                    child = f"{pointer}/{key}/{i}"
                    children.append((child, sub))
                    self._pending.append((self.index[either], [child]))
                common.append(either)
        if "const" in node or "enum" in node:
            self._way(gate, common, None if node.get("enum", [None]) != [] else False)
            return children + self._structure_children(pointer, node)
        for kind in _types(node):
            needs, more = self._structure(pointer, node, kind)
            children += more
            if needs is not None:
                self._way(gate, common + needs)
        return children + self._structure_children(pointer, node)

    def _structure(
        self, pointer: str, node: dict[str, Any], kind: str
    ) -> tuple[list[str] | None, list[tuple[str, Any]]]:
        """What a value of type `kind` needs (None: no such value), and the nodes that names."""
        if kind == "object":
            listed = node.get("properties")
            properties: dict[str, Any] = listed if isinstance(listed, dict) else {}
            extra = node.get("additionalProperties", True)
            needs: list[str] = []
            for name in _listed(node.get("required")):
                if not isinstance(name, str):
                    continue
                if name in properties:
                    needs.append(f"{pointer}/properties/{_escape(name)}")
                elif extra is False:
                    return None, []
                elif isinstance(extra, dict):
                    needs.append(f"{pointer}/additionalProperties")
            return needs, []
        if kind == "array":
            least = node.get("minItems", 0)
            least = least if isinstance(least, int) and not isinstance(least, bool) else 0
            prefix = _listed(node.get("prefixItems"))
            wanted = [f"{pointer}/prefixItems/{i}" for i in range(min(least, len(prefix)))]
            items = node.get("items", True)
            if least > len(prefix):
                if items is False:
                    return None, []
                if isinstance(items, dict):
                    wanted.append(f"{pointer}/items")
            return wanted, []
        return [], []

    def _structure_children(self, pointer: str, node: dict[str, Any]) -> list[tuple[str, Any]]:
        """Every subschema a value of the node may contain (reachable, so checked)."""
        out: list[tuple[str, Any]] = []
        properties = node.get("properties")
        if isinstance(properties, dict):
            out += [(f"{pointer}/properties/{_escape(k)}", v) for k, v in properties.items()]
        for key in ("additionalProperties", "items", "additionalItems"):
            if isinstance(node.get(key), (dict, bool)) and key in node:
                out.append((f"{pointer}/{key}", node[key]))
        out += [(f"{pointer}/prefixItems/{i}", sub) for i, sub in enumerate(_listed(node.get("prefixItems")))]
        return out

    def _resolve(self, ref: str) -> tuple[str, Any] | None:
        """A local reference's (pointer, node); None for one this check cannot follow (llguidance's call)."""
        if not ref.startswith("#"):
            return None
        pointer = unquote(ref[1:])
        if pointer and not pointer.startswith("/"):
            return None  # an anchor: not followed here
        node: Any = self.root
        for part in pointer.split("/")[1:] if pointer else []:
            key = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                return None
        return pointer, node


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _types(node: dict[str, Any]) -> list[str]:
    """The types a node's values may have: `type`, else those its keywords imply, else any."""
    declared = node.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    implied = [
        kind
        for kind, keys in (("object", OBJECT_KEYS), ("array", ARRAY_KEYS))
        if any(k in node for k in keys)
    ]
    return implied or list(ALL_TYPES)
