"""What FairServe adds to every call of the openai SDK: identity headers once per call, the attempt
number per attempt, and the deadline check before every retry.

These are plain functions over the SDK's own request options and responses, so the sync and async
clients share them and the SDK's retry loop stays the one that runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import httpx2
from openai import APITimeoutError
from openai._models import FinalRequestOptions
from openai._utils import is_given

from fairserve_client.deadline import DeadlinePolicy, header_deadline, next_start, now
from fairserve_client.task import current_task_id

IDEMPOTENCY_HEADER = "Idempotency-Key"


class DeadlineExceeded(APITimeoutError):
    """The call's deadline would pass before its next attempt could start, so it was not retried."""

    def __init__(self, request: httpx2.Request, deadline: float) -> None:
        super().__init__(request)
        self.message = f"not retried: the next attempt could not start before the deadline ({deadline:.3f})"
        self.args = (self.message,)
        self.deadline = deadline


def new_workflow_run_id() -> str:
    """A fresh `X-Workflow-Run-Id`: one per client unless the caller names the run."""
    return f"run-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class CallDefaults:
    """Per-client (or per `with_options` copy) values sent with every call."""

    deadline: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    workflow_run_id: str = field(default_factory=new_workflow_run_id)
    task_id: str | None = None  # bound by `Task.client`; otherwise the `with client.task()` in scope

    def with_deadline(self, policy: DeadlinePolicy) -> CallDefaults:
        """A copy with another deadline policy."""
        return replace(self, deadline=policy)


def _has(headers: Mapping[str, object], name: str) -> str | None:
    """The caller's own spelling of header `name`, if it set one."""
    lower = name.lower()
    return next((k for k in headers if k.lower() == lower), None)


def _number(value: object) -> float | None:
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def prepare_call(options: FinalRequestOptions, defaults: CallDefaults) -> FinalRequestOptions:
    """Once per call, before the SDK's first attempt: fix the deadline and fill the identity headers.

    Headers the caller set per call win. A per-call `X-Timeout-Ms` becomes an absolute `X-Deadline`
    here, because resent as it is it would give every retry a fresh deadline.
    """
    headers: dict[str, object] = dict(options.headers) if is_given(options.headers) else {}
    start = now()
    deadline = defaults.deadline.resolve(start)
    timeout_key = _has(headers, "X-Timeout-Ms")
    relative_ms = _number(headers[timeout_key]) if timeout_key is not None else None
    if timeout_key is not None and relative_ms is not None:  # else sent as it is, for the server's 400
        del headers[timeout_key]
        relative = start + relative_ms / 1000.0
        deadline = relative if deadline is None else min(deadline, relative)
    if deadline is not None and _has(headers, "X-Deadline") is None:
        headers["X-Deadline"] = f"{deadline:.3f}"
    task_id = defaults.task_id or current_task_id()
    if task_id is not None and _has(headers, "X-Task-Id") is None:
        headers["X-Task-Id"] = task_id
    if _has(headers, "X-Workflow-Run-Id") is None:
        headers["X-Workflow-Run-Id"] = defaults.workflow_run_id
    prepared = options.model_copy()
    prepared.headers = headers  # type: ignore[assignment]  # str | Omit values, as the SDK's own
    return prepared


def add_attempt(headers: httpx2.Headers, retries_taken: int) -> httpx2.Headers:
    """`X-Attempt` for the ledger: 0 for a call's first attempt, n for its n-th retry (unless set per call)."""
    if "x-attempt" not in headers:
        headers["X-Attempt"] = str(retries_taken)
    return headers


def retry_fits_deadline(response: httpx2.Response, retry_after_s: float | None) -> bool:
    """False when the call's next attempt could not start before its deadline (so it is not sent)."""
    sent = response.request.headers
    deadline = header_deadline(sent)
    if deadline is None:
        return True
    try:
        retries_taken = int(sent.get("x-stainless-retry-count", "0"))
    except ValueError:
        retries_taken = 0
    start = next_start(now(), retry_after_s, response.headers.get("x-estimated-start-ms"), retries_taken)
    return start < deadline


def check_sleep(options: FinalRequestOptions, delay_s: float, request: httpx2.Request) -> None:
    """Before the SDK sleeps for a retry: raise DeadlineExceeded when the wait would end past the deadline.

    This catches retries after a timeout or a lost connection, which have no response to judge by.
    """
    headers = options.headers if is_given(options.headers) else {}
    raw = next((v for k, v in headers.items() if k.lower() == "x-deadline"), None)
    deadline = header_deadline({"x-deadline": raw}) if isinstance(raw, str) else None
    if deadline is not None and now() + delay_s >= deadline:
        raise DeadlineExceeded(request, deadline)
