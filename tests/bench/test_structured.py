"""bench.structured's offline half on the real llguidance binding: the hard schemas compile (nested oneOf whose
branches are disjoint, its anyOf twin, the huge enum, the long patterns), a oneOf whose branches overlap is
refused (llguidance cannot enforce its exclusivity), every compiled schema is masked, and a schema
directory's files join the set."""

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
    overlap = {"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {"type": "integer"}}}]}
    (tmp_path / "set" / "overlap.json").write_text(json.dumps(overlap))
    schemas = load_schemas(str(tmp_path))
    assert set(schemas) == set(hard_schemas()) | {"set/one", "set/overlap"}
    compile_ms, mask_us, refused = compile_and_mask(schemas)
    assert refused == ["set/overlap"]
    assert set(compile_ms) == {"nested-oneOf", "nested-anyOf", "enum-5000", "long-patterns", "set/one"}
    assert all(ms > 0 for ms in compile_ms.values())
    assert len(mask_us) >= len(compile_ms) and all(us >= 0 for us in mask_us)
