"""bench.structured's offline half on the real llguidance binding: the hard schemas are what they claim (nested
oneOf refused as unenforceable, its anyOf twin, the huge enum and the long patterns compiled), every compiled
schema is masked, and a schema directory's files join the set."""

from __future__ import annotations

import json
from pathlib import Path

from bench.structured import compile_and_mask, hard_schemas, load_schemas


def test_hard_schemas_compile_or_are_refused_by_name_and_are_masked(tmp_path: Path) -> None:
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "one.json").write_text(
        json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}}})
    )
    (tmp_path / "set" / "broken.json").write_text("{not json")
    schemas = load_schemas(str(tmp_path))
    assert set(schemas) == set(hard_schemas()) | {"set/one"}
    compile_ms, mask_us, refused = compile_and_mask(schemas)
    assert refused == ["nested-oneOf"]
    assert set(compile_ms) == {"nested-anyOf", "enum-5000", "long-patterns", "set/one"}
    assert all(ms > 0 for ms in compile_ms.values())
    assert len(mask_us) >= len(compile_ms) and all(us >= 0 for us in mask_us)
