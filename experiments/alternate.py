"""Alternating A/B rounds of one experiment over two checkouts, for the experiments that compare them.

On this shared 2-core VM absolute times drift 2x between runs, so an experiment measures both checkouts in
the same run, each round in fresh processes, and swaps which goes first every round. The script is run
again with `--one FLAGS` and the checkout's directory first on PYTHONPATH; the last line it prints is its
sample, a JSON object of numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

Samples = dict[str, list[dict[str, float]]]


def checkouts(against: str | None) -> dict[str, Path]:
    """This checkout as "this" and, with `against`, the other as "other"."""
    here = Path(__file__).resolve().parent.parent
    return {"this": here} | ({"other": Path(against).resolve()} if against else {})


def alternate(script: str, flags: list[str], rounds: int, against: str | None) -> Samples:
    """`rounds` samples of `script --one FLAGS` per checkout, the first side swapped each round; each sample
    is also printed to stderr as it comes."""
    sides = checkouts(against)
    samples: Samples = {name: [] for name in sides}
    for r in range(rounds):
        order = list(sides.items())
        for name, path in order if r % 2 == 0 else order[::-1]:
            env = {**os.environ, "PYTHONPATH": str(path)}
            cmd = [sys.executable, str(Path(script).resolve()), "--one", *flags]
            done = subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, check=True)
            samples[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, json.dumps({k: round(v, 2) for k, v in samples[name][-1].items()}), file=sys.stderr)
    return samples
