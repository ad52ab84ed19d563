"""The generation path reads its headers in one pass over the scope: each the value Starlette's
`request.headers.get` gives (the first occurrence), None when not sent, read once per request."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from gateway.edge.auth import bearer
from gateway.edge.errors import APIError
from gateway.openai import parsing as rp

NAMES = {
    "attempt": "x-attempt",
    "idempotency_key": "idempotency-key",
    "task_id": "x-task-id",
    "workflow_run_id": "x-workflow-run-id",
    "deadline": "x-deadline",
    "timeout_ms": "x-timeout-ms",
    "on_infeasible": "x-on-infeasible",
}


def _scope(headers: list[tuple[str, str]]) -> dict[str, Any]:
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": raw}


def test_each_header_is_what_starlette_reads_the_first_occurrence_wins() -> None:
    sent = [
        ("authorization", "Bearer fsk-first"),
        ("x-attempt", "2"),
        ("idempotency-key", "k1"),
        ("x-task-id", "t1"),
        ("x-workflow-run-id", "w1"),
        ("x-deadline", "1700000000"),
        ("x-timeout-ms", "500"),
        ("x-on-infeasible", "fallback"),
        ("x-other", "ignored"),
    ]
    scope = _scope(sent + [(k, v + "-again") for k, v in sent])
    read = rp.request_headers(scope)
    starlette = Request(scope).headers
    for field, name in NAMES.items():
        assert getattr(read, field) == starlette.get(name)
    assert read.bearer == bearer(Request(scope)) == "fsk-first"


def test_headers_not_sent_are_none() -> None:
    read = rp.request_headers(
        _scope([("authorization", "Bearer fsk-x"), ("content-type", "application/json")])
    )
    assert read == rp.RequestHeaders("fsk-x")
    assert rp.request_headers(_scope([])) == rp.RequestHeaders(None)


@pytest.mark.parametrize("value", ["Basic fsk-x", "Bearer ", "Bearer", "fsk-x", ""])
def test_an_authorization_that_is_not_a_bearer_token_has_none(value: str) -> None:
    scope = _scope([("authorization", value)])
    assert rp.request_headers(scope).bearer is None
    assert bearer(Request(scope)) is None


def test_the_scheme_is_case_blind_and_the_token_stripped() -> None:
    assert rp.request_headers(_scope([("authorization", "bEaReR   fsk-x  ")])).bearer == "fsk-x"


def test_read_once_a_request() -> None:
    scope = _scope([("x-attempt", "1")])
    first = rp.request_headers(scope)
    scope["headers"] = [(b"x-attempt", b"9")]  # not read again: the edge's reading is the request's
    assert rp.request_headers(scope) is first


def test_identity_and_deadline_refuse_bad_headers_by_name() -> None:
    with pytest.raises(APIError) as bad:
        rp.identity(rp.RequestHeaders(None, attempt="-1"), "req-1")
    assert bad.value.param == "X-Attempt"
    with pytest.raises(APIError) as bad:
        rp.identity(rp.RequestHeaders(None, task_id="a b"), "req-1")
    assert bad.value.param == "x-task-id"
    with pytest.raises(APIError) as bad:
        rp.deadline(rp.RequestHeaders(None, timeout_ms="soon"), 0.0)
    assert bad.value.param == "X-Timeout-Ms"
    ident = rp.identity(rp.RequestHeaders(None, attempt=" 3 ", task_id="t.1"), "req-1")
    assert (ident.request_id, ident.attempt, ident.task_id, ident.workflow_run_id) == (
        "req-1",
        3,
        "t.1",
        None,
    )
    assert rp.deadline(rp.RequestHeaders(None), 0.0) is None
    assert rp.deadline(rp.RequestHeaders(None, timeout_ms="500"), 10.0) == 10.5
