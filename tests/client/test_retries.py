"""Retries over real HTTP against a real `fairserve serve`: one key per call, one generation, fixed deadlines."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai
import pytest

from fairserve_client import DeadlineExceeded, FairServe
from tests.client.conftest import Hogs, Served, on_response
from tests.gateway.conftest import wait_for

MODEL = "fairserve-tiny"


def _recording_client(
    served: Served, tenant: str, sent: list[Any], responses: list[Any], **kwargs: Any
) -> FairServe:
    http = openai.DefaultHttpxClient(
        event_hooks={
            "request": [sent.append, *kwargs.pop("request_hooks", [])],
            "response": [responses.append, *kwargs.pop("response_hooks", [])],
        }
    )
    return FairServe(base_url=served.base_url, api_key=served.keys[tenant], http_client=http, **kwargs)


def test_429_then_success_retries_with_the_same_key_and_the_ledger_has_one_charged_row(
    served: Served,
) -> None:
    sent: list[Any] = []
    responses: list[Any] = []
    with Hogs(served, "hogs-429") as hogs:
        # Tenant "narrow" may queue one request: one waiting behind the hogs fills its bound.
        first = threading.Thread(
            target=lambda: httpx.post(
                served.url + "/v1/completions",
                timeout=120,
                headers={"Authorization": f"Bearer {served.keys['narrow']}"},
                json={"model": MODEL, "prompt": "queued", "max_tokens": 2},
            )
        )
        first.start()
        wait_for(lambda: served.engine_stats()["waiting"] >= 1, 30, "narrow's first request queued")
        client = _recording_client(
            served,
            "narrow",
            sent,
            responses,
            max_retries=3,
            deadline_in=120,
            response_hooks=[on_response(429, hogs.cancel)],
        )
        out = client.completions.create(model=MODEL, prompt="after the storm", max_tokens=4)
        first.join(60)
    assert [r.status_code for r in responses] == [429, 200]
    rejected = responses[0]
    assert rejected.headers["retry-after-ms"] == str(int(rejected.headers["retry-after"]) * 1000)
    keys = {r.headers["idempotency-key"] for r in sent}
    assert len(keys) == 1 and next(iter(keys))
    assert [r.headers["x-attempt"] for r in sent] == ["0", "1"]
    assert sent[0].headers["x-deadline"] == sent[1].headers["x-deadline"]  # not extended by the retry
    run_id = client.fairserve.workflow_run_id
    rows = served.ledger_rows(1, "workflow_run_id = :w", w=run_id)
    assert len(rows) == 1
    row = rows[0]
    assert row["status"] == "completed" and row["attempt"] == 1 and row["charged_service"] > 0
    assert out.usage is not None and row["completion_tokens"] == out.usage.completion_tokens


def test_a_read_timeout_retry_attaches_to_the_first_attempt_instead_of_generating_again(
    served: Served,
) -> None:
    sent: list[Any] = []
    responses: list[Any] = []
    with Hogs(served, "hogs-timeout") as hogs:

        def free_the_engine(request: Any) -> None:
            if request.headers.get("x-attempt") == "1":
                hogs.cancel()

        # The first attempt waits behind the hogs past its read timeout; its retry frees the engine.
        client = _recording_client(
            served, "agent", sent, responses, max_retries=3, timeout=2.0, request_hooks=[free_the_engine]
        )
        out = client.completions.create(
            model=MODEL, prompt="patience", max_tokens=8, extra_body={"ignore_eos": True}
        )  # the built-in model samples EOS now and then: 8 tokens, whatever it draws
    assert len(sent) >= 2 and len({r.headers["idempotency-key"] for r in sent}) == 1
    assert responses[-1].status_code == 200 and responses[-1].headers.get("idempotent-replayed") == "true"
    rows = served.ledger_rows(1, "workflow_run_id = :w", w=client.fairserve.workflow_run_id)
    assert len(rows) == 1, rows  # one engine request served every attempt
    assert rows[0]["status"] == "completed" and rows[0]["attempt"] == 0
    assert out.usage is not None and rows[0]["completion_tokens"] == out.usage.completion_tokens == 8


def test_a_deadline_its_own_run_cannot_meet_is_sent_once_by_either_client(served: Served) -> None:
    # 1500 decode steps cannot finish in 0.5 s even on an idle engine: a 400 without Retry-After, which
    # neither the fairserve client nor the plain SDK retries (tests/client/test_refusals.py: the SDK alone).
    with Hogs(served, "hogs-deadline"):
        sent: list[Any] = []
        client = _recording_client(served, "agent", sent, [], max_retries=3)
        with pytest.raises(openai.BadRequestError) as err:
            client.with_options(deadline_in=0.5).completions.create(
                model=MODEL, prompt="too late", max_tokens=1500, extra_body={"ignore_eos": True}
            )
        assert err.value.response.headers.get("x-estimated-start-ms") is not None
        assert "retry-after" not in err.value.response.headers
        assert isinstance(err.value.body, dict) and err.value.body["code"] == "deadline_unmeetable"
        assert len(sent) == 1


def test_a_timed_out_attempt_is_not_retried_when_the_back_off_would_end_past_the_deadline(
    served: Served,
) -> None:
    with Hogs(served, "hogs-deadline-timeout"):
        sent: list[Any] = []
        client = _recording_client(served, "agent", sent, [], max_retries=3, timeout=0.5)
        with pytest.raises(DeadlineExceeded) as err:
            client.with_options(deadline_in=0.8).completions.create(
                model=MODEL, prompt="queued", max_tokens=1
            )
        assert isinstance(err.value, openai.APITimeoutError)
        assert len(sent) == 1
        assert float(sent[0].headers["x-deadline"]) == pytest.approx(err.value.deadline, abs=1e-3)
