"""`fairserve db|tenants|keys|usage` end to end on a SQLite data directory (gateway/cli/billing.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from billing import BillingStore, Database, default_db_url
from gateway.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tenants_keys_usage_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--data-dir", str(tmp_path / "data")]
    assert run(capsys, "db", "upgrade", *d)[0] == 0
    code, out, _ = run(
        capsys, "tenants", "add", "acme", "--weight", "2", "--tokens-per-minute", "10_000", "--json", *d
    )
    assert code == 0 and json.loads(out)[0]["tokens_per_minute"] == 10_000
    code, _, err = run(capsys, "tenants", "add", "acme", *d)
    assert code == 1 and "already exists" in err and "Traceback" not in err
    code, out, _ = run(
        capsys,
        "tenants",
        "set",
        "acme",
        "--priority-class",
        "0",
        "--tokens-per-minute",
        "none",
        "--disable",
        "--actor",
        "ops",
        "--json",
        *d,
    )
    row = json.loads(out)[0]
    assert (
        code == 0
        and row["priority_class"] == 0
        and row["tokens_per_minute"] is None
        and row["disabled"] is True
    )
    code, _, err = run(capsys, "tenants", "set", "acme", "--weight", "-1", *d)
    assert code == 1 and "weight" in err
    run(capsys, "tenants", "set", "acme", "--enable", *d)
    code, secret, err = run(capsys, "keys", "create", "--tenant", "acme", *d)
    secret = secret.strip()
    assert code == 0 and "not shown again" in err
    store = BillingStore(Database(default_db_url(tmp_path / "data")))
    verified = store.verify_key(secret)
    assert verified is not None and verified[0].name == "acme"
    code, out, _ = run(capsys, "keys", "list", "--json", *d)
    listed = json.loads(out)
    assert [k["id"] for k in listed] == [verified[1].id] and secret not in out
    assert run(capsys, "keys", "revoke", listed[0]["prefix"], *d)[0] == 0
    assert store.verify_key(secret) is None
    code, _, err = run(capsys, "keys", "revoke", "nope", *d)
    assert code == 1 and "no API key" in err
    code, out, _ = run(capsys, "usage", "--tenant", "acme", "--since", "7d", *d)
    assert code == 0 and "(none)" in out
    code, _, err = run(capsys, "usage", "--tenant", "ghost", *d)
    assert code == 1 and "no tenant" in err
    assert [e.actor for e in store.list_audit(10) if e.action == "tenant.update"][-1] == "ops"


def test_bad_inputs_exit_with_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["usage", "--since", "yesterday", "--data-dir", str(tmp_path)])
    assert exc.value.code == 2 and "invalid time" in capsys.readouterr().err
    code, _, err = run(capsys, "tenants", "list", "--db", "mysql://u@h/db")
    assert code == 1 and "unsupported database" in err
    with pytest.raises(SystemExit):
        main(["tenants", "add", "x", "--tokens-per-day", "-5", "--data-dir", str(tmp_path)])


def test_tenants_set_cache_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = ["--data-dir", str(tmp_path / "data")]
    assert run(capsys, "db", "upgrade", *d)[0] == 0
    assert run(capsys, "tenants", "add", "acme", "--cache-group", "org-1", "--json", *d)[0] == 0
    code, out, _ = run(capsys, "tenants", "set", "acme", "--cache-group", "org-2", "--json", *d)
    assert code == 0 and json.loads(out)[0]["cache_group"] == "org-2"
    code, out, _ = run(capsys, "tenants", "set", "acme", "--cache-group", "none", "--json", *d)
    assert code == 0 and json.loads(out)[0]["cache_group"] is None
    code, _, err = run(capsys, "tenants", "set", "acme", "--cache-group", "has space", *d)
    assert code == 1 and "cache_group" in err


def test_every_command_shares_the_servers_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FAIRSERVE_DATA_DIR", raising=False)
    monkeypatch.delenv("FAIRSERVE_DB_URL", raising=False)
    assert run(capsys, "db", "upgrade")[0] == 0
    assert run(capsys, "tenants", "add", "bob")[0] == 0
    # `fairserve serve`'s default data directory, which GatewaySettings also names.
    from gateway.settings import GatewaySettings

    serve_db = BillingStore(Database(default_db_url(tmp_path / GatewaySettings().data_dir)))
    assert [t.name for t in serve_db.list_tenants()] == ["bob"]
    monkeypatch.setenv("FAIRSERVE_DATA_DIR", str(tmp_path / "elsewhere"))
    assert run(capsys, "db", "upgrade")[0] == 0
    assert (tmp_path / "elsewhere" / "fairserve.db").is_file()


def test_a_database_without_schema_or_tenants_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = ["--data-dir", str(tmp_path / "empty")]
    for argv in (
        ["tenants", "list"],
        ["tenants", "add", "bob"],
        ["keys", "create", "--tenant", "bob"],
        ["usage"],
    ):
        code, _, err = run(capsys, *argv, *d)
        assert code == 1 and "has no fairserve schema" in err and "fairserve db upgrade" in err, argv
    assert run(capsys, "db", "upgrade", *d)[0] == 0
    for argv in (["tenants", "list"], ["keys", "list"], ["usage"]):
        code, _, err = run(capsys, *argv, *d)
        assert code == 1 and "has no tenants" in err and str(tmp_path / "empty") in err, argv
    assert run(capsys, "tenants", "add", "bob", *d)[0] == 0
    assert run(capsys, "tenants", "list", *d)[0] == 0
