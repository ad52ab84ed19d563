"""What the benchmarks share: flags, the served model, random prompt text, closed-loop clients, Markdown tables."""

from __future__ import annotations

import argparse
import asyncio
import random
import string
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpx


def parser(doc: str | None, **flags: Any) -> argparse.ArgumentParser:
    """A parser described by `doc`'s first paragraph, with a `--name` per flag: its default (whose type it
    takes; None for a string) or `(default, help)`."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    for name, value in flags.items():
        default, help_ = value if isinstance(value, tuple) else (value, None)
        kind = str if default is None else type(default)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=help_)
    return p


def served_model(url: str, key: str) -> str:
    """The first model that the server at `url` lists to API key `key`."""
    resp = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30.0)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def text(n: int, rng: random.Random, alphabet: str = string.ascii_lowercase + " ") -> str:
    """`n` random characters: `n` tokens of the byte tokenizer."""
    return "".join(rng.choice(alphabet) for _ in range(n))


async def closed_loop(workers: int, until: float, once: Callable[[int], Awaitable[object]]) -> None:
    """`workers` clients, client `i` awaiting `once(i)` again and again until monotonic time `until`."""

    async def worker(i: int) -> None:
        while time.monotonic() < until:
            await once(i)

    await asyncio.gather(*(worker(i) for i in range(workers)))


def table(header: str, align: str, rows: Iterable[str]) -> list[str]:
    """A Markdown table. `header` and each row are cells joined by " | " (no outer pipes); `align` has one
    letter per column, "l" or "r" (right-aligned numbers)."""
    # Our own four lines: tabulate is not a dependency, and these rows are already formatted cells.
    rule = "|".join("---:" if a == "r" else "---" for a in align)
    return [f"| {header} |", f"|{rule}|", *(f"| {row} |" for row in rows)]
