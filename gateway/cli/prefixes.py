"""`fairserve prefixes add|list|remove`: public prompt prefixes, through a running gateway's admin API.

The CLI goes through the gateway rather than the database because a text prefix must be tokenised by
the served model's tokenizer exactly as prompts are, and the gateway reloads its index at once. The
admin token is read from the data directory (where `fairserve serve` keeps it) unless given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from gateway.edge.auth import ADMIN_TOKEN_FILE
from gateway.settings import GatewaySettings
from gateway.settings_base import StorageSettings

_FIELDS = GatewaySettings.model_fields
COLUMNS = ("id", "model", "name", "tokens", "created_at")


def _base_url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    return f"http://{_FIELDS['host'].default}:{_FIELDS['port'].default}"


def _token(args: argparse.Namespace) -> str:
    if args.admin_token:
        return str(args.admin_token)
    data_dir = Path(args.data_dir) if args.data_dir else StorageSettings().data_dir
    path = data_dir / ADMIN_TOKEN_FILE
    if not path.is_file():
        raise ValueError(f"no admin token at {path}: give --admin-token or the server's --data-dir")
    return path.read_text().strip()


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    headers = {"Authorization": f"Bearer {_token(args)}"}
    with httpx.Client(base_url=_base_url(args), headers=headers, timeout=60) as client:
        resp = client.request(method, f"/admin/api/prefixes{path}", **kwargs)
    body = resp.json()
    if resp.status_code >= 400:
        error = body.get("error", {})
        param = f" ({error['param']})" if error.get("param") else ""
        raise ValueError(f"{resp.status_code}{param}: {error.get('message', resp.text)}")
    return body


def _print(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("(none)")
        return
    widths = [max(len(c), *(len(str(r.get(c))) for r in rows)) for c in COLUMNS]
    print("  ".join(c.upper().ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(str(r.get(c)).ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())


def cmd_add(args: argparse.Namespace) -> int:
    """Register a prefix from --text, --file or --token-ids."""
    body: dict[str, Any] = {"model": args.model, "name": args.name}
    if args.file is not None:
        body["text"] = Path(args.file).read_text()
    elif args.text is not None:
        body["text"] = args.text
    else:
        body["token_ids"] = [int(t) for t in args.token_ids.split(",") if t.strip()]
    _print(args, [_call(args, "POST", "", json=body)])
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """List registered prefixes (of one model with --model)."""
    params = {"model": args.model} if args.model else {}
    _print(args, _call(args, "GET", "", params=params)["prefixes"])
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    """Unregister a prefix by id or name."""
    params = {"model": args.model} if args.model else {}
    _print(args, [_call(args, "DELETE", f"/{args.ref}", params=params)])
    return 0


def _guarded(func: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except (ValueError, OSError, httpx.HTTPError) as exc:
            print(f"fairserve prefixes: error: {exc}", file=sys.stderr)
            return 1

    return run


def register(subparsers: Any) -> None:
    """Add the `prefixes` command family."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help="the gateway (default: serve's host and port)")
    common.add_argument("--admin-token", default=None, help="admin token (default: read from --data-dir)")
    common.add_argument("--data-dir", default=None, help="the server's data directory [FAIRSERVE_DATA_DIR]")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    prefixes = subparsers.add_parser("prefixes", help="public prompt prefixes shared by every tenant")
    sub = prefixes.add_subparsers(dest="prefixes_action", required=True)
    add = sub.add_parser("add", parents=[common], help="register a public prefix")
    add.add_argument("name")
    add.add_argument("--model", required=True, help="the served model the prefix is for")
    source = add.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the prefix text (tokenised as a completions prompt)")
    source.add_argument("--file", help="read the prefix text from this file")
    source.add_argument("--token-ids", help="comma-separated token ids")
    add.set_defaults(func=_guarded(cmd_add))
    lst = sub.add_parser("list", parents=[common], help="list public prefixes")
    lst.add_argument("--model", default=None)
    lst.set_defaults(func=_guarded(cmd_list))
    remove = sub.add_parser("remove", parents=[common], help="unregister a public prefix by id or name")
    remove.add_argument("ref")
    remove.add_argument("--model", default=None)
    remove.set_defaults(func=_guarded(cmd_remove))
