"""Public prefixes: prompt prefixes an operator registered as shareable across tenants, and the match.

A registered prefix is a model's token ids (registered as text, the gateway tokenises it once). A
request *starts with* a prefix when its prompt holds every token of it but possibly the last (a
tokeniser may merge the prefix's last token with what follows); its `public_prefix_tokens` is then
the length of the common run, and the blocks wholly inside that run are keyed in the public namespace
(engine/core/kv_cache.py, `PUBLIC_ROOT`). Every block after stays keyed by tenant, cache group and salt.

Why the whole prefix must match, not any leading block of it: a tenant learns from `usage`
(`public_cached_tokens`) whether its prompt hit public blocks. With whole-prefix matching that answer
says only "your prompt starts with a registered prefix", which it can learn only by already sending
the whole prefix; it cannot discover a registered prompt block by block. Public blocks only ever hold
registered tokens, so nothing a tenant sent after a prefix is ever keyed publicly.

Only the gateway matches (it holds the registry, persisted in SQL, billing/prefixes.py); the engine
trusts `RequestMeta.public_prefix_tokens` as it trusts the tenant id, so the registry reaches every
engine, local or attached, with each request and needs no message of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# A registered prefix may lose at most this many trailing tokens to a merge with the text after it.
BOUNDARY_SLACK = 1


@dataclass(frozen=True)
class PublicPrefix:
    """One registered prefix: its model, operator-chosen name and token ids."""

    model: str
    name: str
    token_ids: tuple[int, ...]


class PublicPrefixIndex:
    """The registered prefixes by model, and `match`: how many leading prompt tokens are public."""

    def __init__(self, prefixes: Iterable[PublicPrefix] = ()) -> None:
        self._by_model: dict[str, list[list[int]]] = {}
        self.replace(prefixes)

    def replace(self, prefixes: Iterable[PublicPrefix]) -> None:
        """Swap in a new registry (after a change or a reload); longest prefixes are tried first."""
        by_model: dict[str, list[list[int]]] = {}
        for p in prefixes:
            by_model.setdefault(p.model, []).append(list(p.token_ids))
        for ids in by_model.values():
            ids.sort(key=len, reverse=True)
        self._by_model = by_model

    def match(self, model: str, prompt: Sequence[int]) -> int:
        """Leading prompt tokens inside a registered prefix of `model` that the prompt starts with (0: none).

        At most two list compares per registered prefix (C speed, stopping at the first difference):
        the whole prefix, then the prefix less its last token.
        """
        head = list(prompt[: len(self._by_model[model][0])]) if self._by_model.get(model) else []
        for ids in self._by_model.get(model, ()):
            n = len(ids)
            if not head or head[0] != ids[0] or len(head) < n - BOUNDARY_SLACK:
                continue
            if head[:n] == ids:
                return n
            if head[: n - BOUNDARY_SLACK] == ids[: n - BOUNDARY_SLACK]:
                return n - BOUNDARY_SLACK
        return 0

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._by_model.values())
