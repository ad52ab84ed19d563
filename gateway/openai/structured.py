"""`response_format` as the engine's Grammar: structured outputs by constrained decoding (engine/worker/grammar/).

The schema travels as its JSON text; the engine compiles it off its loop and refuses (400, naming the
field) a schema that does not compile or uses a keyword llguidance does not enforce.
"""

from __future__ import annotations

import json

from engine.core.sampling_params import Grammar
from gateway.openai.schemas import ResponseFormat

SCHEMA_FIELD = "response_format.json_schema.schema"


def response_grammar(fmt: ResponseFormat | None) -> Grammar | None:
    """The Grammar a response format asks for; None for plain text."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.json_schema is None or fmt.json_schema.schema_ is None:
        return Grammar("json_object", "", "response_format")
    # Keys in the caller's order: llguidance writes an object's properties in the order the schema lists them.
    source = json.dumps(fmt.json_schema.schema_, separators=(",", ":"))
    return Grammar("json_schema", source, SCHEMA_FIELD)
