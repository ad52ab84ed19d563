"""`fairserve prefixes add|list|remove` against the real gateway's admin API."""

from __future__ import annotations

import json
import uuid

import pytest

from gateway.cli import main
from tests.gateway.conftest import Server


def _cli(server: Server, *argv: str, token: str | None = None) -> list[str]:
    return ["prefixes", *argv, "--url", server.url, "--admin-token", token or server.state.admin_token]


def test_add_list_remove_round_trip(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    text = f"Shared instructions {uuid.uuid4().hex}. " * 3
    assert main(_cli(server, "add", name, "--model", server.model, "--text", text, "--json")) == 0
    added = json.loads(capsys.readouterr().out)[0]
    assert added["name"] == name and added["tokens"] >= 40
    assert main(_cli(server, "list", "--json")) == 0
    assert name in [p["name"] for p in json.loads(capsys.readouterr().out)]
    assert main(_cli(server, "remove", name, "--model", server.model)) == 0
    assert name in capsys.readouterr().out
    assert main(_cli(server, "remove", name)) == 1
    assert "404" in capsys.readouterr().err


def test_a_tenant_key_is_refused(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_cli(server, "list", token=server.keys["alice"])) == 1
    assert "403" in capsys.readouterr().err
