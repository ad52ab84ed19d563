"""The gateway's public-prefix match (gateway/public_prefixes.py): the whole registered prefix, less at most
its last token, or nothing (what the scheduler does with the match: tests/engine/test_public_prefixes.py)."""

from __future__ import annotations

from gateway.public_prefixes import PublicPrefix, PublicPrefixIndex

SYSTEM = list(range(100, 114))  # 14 tokens


def test_index_matches_the_whole_prefix_less_a_boundary_token() -> None:
    index = PublicPrefixIndex([PublicPrefix("m", "sys", tuple(SYSTEM)), PublicPrefix("m", "x", (1, 2, 3))])
    assert index.match("m", SYSTEM + [1, 2]) == len(SYSTEM)
    assert index.match("m", SYSTEM[:-1] + [999, 5]) == len(SYSTEM) - 1  # the last token merged away
    assert index.match("m", SYSTEM[:8] + [999] * 10) == 0  # a partial prefix is no match: no probing
    assert index.match("other-model", SYSTEM + [1]) == 0
    assert index.match("m", [1, 2, 3, 4]) == 3
    assert index.match("m", []) == 0
