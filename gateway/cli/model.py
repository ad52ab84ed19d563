"""`fairserve model init DIR`: write the embedded default model to a directory of your choice."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `model` command family (`model init`)."""
    model = subparsers.add_parser("model", help="manage model directories")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    init = model_sub.add_parser(
        "init", help="write the embedded default model (tiny seeded Llama + byte tokenizer) to DIR"
    )
    init.add_argument("dir", metavar="DIR", help="directory to write config.json, weights and tokenizer into")
    init.add_argument("--force", action="store_true", help="overwrite a non-empty directory")
    init.set_defaults(func=init_model)


def init_model(args: argparse.Namespace) -> int:
    """Write the default model into args.dir and list the files written; 1 if DIR is in the way."""
    from engine.worker.loader import write_default_model  # torch: only when a model is written

    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        print(f"error: {target} exists and is not a directory", file=sys.stderr)
        return 1
    if target.is_dir() and any(target.iterdir()) and not args.force:
        print(f"error: {target} is not empty (use --force to overwrite)", file=sys.stderr)
        return 1
    write_default_model(target)
    print(f"wrote the default model to {target}:")
    for file in sorted(target.iterdir()):
        if file.is_file():
            print(f"  {file.name}  {file.stat().st_size} bytes")
    return 0
