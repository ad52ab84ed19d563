"""Logs to operate by, read from a started `fairserve serve`'s own output (issue 56): the start-up summary,
`--log-format json`, `--log-level`, the access log, SIGTERM's drain and end, and a banner that names the
secret files, not the secrets, when stdout is not a terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai

from gateway.cli.serve_run import shown_banner
from gateway.settings import GatewaySettings
from tests.gateway.conftest import wait_for
from tests.gateway.serve_process import ServeProcess

SUMMARY_KEYS = {"model", "device", "dtype", "kv_blocks", "kv_tokens", "seats", "policy", "database", "redis"}


def _records(proc: ServeProcess) -> list[dict[str, Any]]:
    """The JSON log records among the process's output lines (the banner's lines are not JSON)."""
    out = []
    for line in list(proc.output):
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def test_json_logs_summary_access_lines_and_sigterm_without_a_secret(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path, "--max-num-seqs", "4", "--access-log", "--log-format", "json")
    try:
        # stdout is a pipe: the banner names the files, never the secrets.
        assert set(proc.files) == {"api_key", "metrics_token", "admin_token"}
        assert proc.files["api_key"] == str((tmp_path / "api_key").resolve())
        summary = wait_for(
            lambda: next((r for r in _records(proc) if r["message"].startswith("serving")), None),
            30,
            "summary",
        )
        assert SUMMARY_KEYS | {"engines", "ledger"} <= set(summary) and summary["level"] == "INFO"
        assert summary["ledger"] == "ok" and summary["seats"] == 4 and summary["kv_blocks"] > 0
        assert summary["kv_tokens"] % summary["kv_blocks"] == 0 and summary["device"] == "cpu"
        api = openai.OpenAI(base_url=proc.url + "/v1", api_key=proc.banner["api_key"], max_retries=0)
        model = api.models.list().data[0].id
        done = api.completions.with_raw_response.create(
            model=model, prompt="hello", max_tokens=5, extra_body={"ignore_eos": True}
        )
        request_id = done.headers["x-request-id"]
        bad = httpx.post(
            proc.url + "/v1/completions", json={}, headers={"Authorization": "Bearer sk-wrong-key"}
        )
        assert bad.status_code == 401
        access = wait_for(
            lambda: [r for r in _records(proc) if r["logger"] == "fairserve.access"] or None, 30, "access"
        )
        served = next(r for r in access if r["request_id"] == request_id)
        assert served["message"] == "request"  # the fields are keys, not repeated in the message
        assert (served["tenant"], served["status"], served["path"]) == ("demo", 200, "/v1/completions")
        assert served["completion_tokens"] == 5 and served["prompt_tokens"] > 0
        assert served["queue_ms"] >= 0 and served["total_ms"] >= served["queue_ms"]
        refused = wait_for(lambda: [r for r in _records(proc) if r.get("status") == 401] or None, 30, "401")
        assert refused[0]["tenant"] == "-"
        proc.terminate()
        assert proc.wait(60) == 0
        messages = [r["message"] for r in _records(proc)]
        assert "SIGTERM: refusing new requests and draining" in messages
        assert any(m.startswith("draining: ") for m in messages)
        assert any(m.startswith("drained in ") for m in messages)
        assert messages[-1] == "stopped"
    finally:
        proc.stop()
    banner = ("url: ", "admin: ", "api_key_file: ", "metrics_token_file: ", "admin_token_file: ")
    plain = [line for line in proc.output if not line.startswith(("{", *banner))]
    assert plain == []  # every log line is a JSON record, uvicorn's included
    text = "".join(proc.output)
    for secret in (
        proc.banner["api_key"],
        proc.banner["admin_token"],
        proc.banner["metrics_token"],
        "sk-wrong",
    ):
        assert secret not in text  # neither the banner nor any log line holds a key or token


def test_print_secrets_shows_the_demo_key_through_a_pipe_as_make_serve_does(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path, "--print-secrets")
    try:
        assert proc.files == {}  # no file names: the secrets themselves
        printed = [line.split(": ", 1)[1].strip() for line in proc.output if line.startswith("api_key: ")]
        assert printed == [(tmp_path / "api_key").read_text().strip()] and printed[0].startswith("fsk_")
        api = openai.OpenAI(base_url=proc.url + "/v1", api_key=printed[0], max_retries=0)
        assert api.models.list().data
    finally:
        proc.stop()
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    assert "fairserve serve --print-secrets" in makefile  # the quick start's command asks for them


def test_log_level_warning_leaves_out_info_and_text_is_the_default(tmp_path: Path) -> None:
    proc = ServeProcess(tmp_path, "--access-log", "--log-level", "warning")
    try:
        api = openai.OpenAI(base_url=proc.url + "/v1", api_key=proc.banner["api_key"], max_retries=0)
        model = api.models.list().data[0].id
        api.completions.create(model=model, prompt="hello", max_tokens=2)
        proc.terminate()
        assert proc.wait(60) == 0
    finally:
        proc.stop()
    text = "".join(proc.output)
    assert " INFO " not in text and "serving model=" not in text and "request request_id=" not in text


def test_a_terminal_gets_the_secrets_and_a_pipe_the_files(tmp_path: Path) -> None:
    settings = GatewaySettings(data_dir=tmp_path)
    for name in ("api_key", "metrics_token", "admin_token"):
        (tmp_path / name).write_text(f"{name}-secret")
    secrets = {name: f"{name}-secret" for name in ("api_key", "metrics_token", "admin_token")}
    assert shown_banner(secrets, settings, tty=True) == secrets  # `make serve`: the demo key to paste
    shown = shown_banner(secrets, settings, tty=False)
    assert list(shown) == ["api_key_file", "metrics_token_file", "admin_token_file"]
    assert shown["api_key_file"] == str((tmp_path / "api_key").resolve())
    none = {**secrets, "api_key": "none (tenant 'demo' already exists)"}
    assert shown_banner(none, settings, tty=False)["api_key"] == none["api_key"]
