"""FairServe and AsyncFairServe: openai.OpenAI / AsyncOpenAI that use what a fairserve server offers.

They subclass the SDK's clients and hook four of its own seams instead of wrapping its calls, so every
OpenAI call, streaming and raw responses included, keeps working unchanged:

* `_idempotency_header`: the SDK already makes one idempotency key per call and reuses it for every
  retry of that call, but sends it only when this attribute names a header (it is None in
  openai-python). Set to `Idempotency-Key`, a retry attaches to or replays the first attempt.
* `request()`: once per call, before the SDK's retry loop, the deadline is fixed and the identity
  headers filled in (fairserve_client.calls.prepare_call); every attempt reuses those options.
* `_build_headers()`: per attempt, `X-Attempt` from the SDK's own retry count.
* `_should_retry()` / `_sleep_for_retry()`: the SDK's decision and back-off, plus one more refusal:
  no retry whose attempt could not start before the deadline.

These are private SDK methods, so the openai versions the package accepts are pinned to the major
version it was checked against (fairserve_client/pyproject.toml); its tests exercise every hook.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Self

import httpx2
import openai
from openai._models import FinalRequestOptions

from fairserve_client.calls import (
    IDEMPOTENCY_HEADER,
    CallDefaults,
    add_attempt,
    check_sleep,
    new_workflow_run_id,
    prepare_call,
    retry_fits_deadline,
)
from fairserve_client.deadline import Deadline, DeadlinePolicy
from fairserve_client.task import AsyncTask, Task

_KEEP: Any = object()  # "not given" for with_options, where None means "no deadline"


def _defaults(
    deadline: Deadline | None, deadline_in: float | None, workflow_run_id: str | None, task_id: str | None
) -> CallDefaults:
    return CallDefaults(
        DeadlinePolicy.of(deadline, deadline_in), workflow_run_id or new_workflow_run_id(), task_id
    )


def _copy_kwargs(
    defaults: CallDefaults, deadline: Any, deadline_in: Any, workflow_run_id: str | None, task_id: str | None
) -> dict[str, Any]:
    """The fairserve arguments a `with_options` copy is built with: naming either deadline replaces both."""
    policy = defaults.deadline
    if deadline is not _KEEP or deadline_in is not _KEEP:
        policy = DeadlinePolicy.of(
            None if deadline is _KEEP else deadline, None if deadline_in is _KEEP else deadline_in
        )
    return {
        "deadline": None if policy.at is None else policy.at,
        "deadline_in": policy.within_s,
        "workflow_run_id": workflow_run_id or defaults.workflow_run_id,
        "_task_id": task_id or defaults.task_id,
    }


class FairServe(openai.OpenAI):
    """openai.OpenAI with idempotent retries, fixed deadlines, tasks and ledger identity (module docstring).

    `deadline` (aware datetime or epoch seconds) and `deadline_in` (seconds from each call's start)
    are defaults for every call; `client.with_options(deadline_in=5)` sets them for the calls made
    through that copy. `workflow_run_id` is sent as `X-Workflow-Run-Id` (a fresh one per client by default).
    """

    def __init__(
        self,
        *,
        deadline: Deadline | None = None,
        deadline_in: float | None = None,
        workflow_run_id: str | None = None,
        _task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._idempotency_header = IDEMPOTENCY_HEADER
        self.fairserve = _defaults(deadline, deadline_in, workflow_run_id, _task_id)

    def copy(
        self,
        *,
        deadline: Any = _KEEP,
        deadline_in: Any = _KEEP,
        workflow_run_id: str | None = None,
        _task_id: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """openai's `copy`/`with_options`, plus the fairserve defaults (inherited unless given)."""
        extra = {
            **kwargs.pop("_extra_kwargs", {}),
            **_copy_kwargs(self.fairserve, deadline, deadline_in, workflow_run_id, _task_id),
        }
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy

    def task(self, task_id: str | None = None) -> Task:
        """`with client.task() as task:` tags the calls inside with one `X-Task-Id` (fairserve_client.task)."""
        return Task(self, task_id)

    def request(
        self, cast_to: Any, options: FinalRequestOptions, *, stream: bool = False, stream_cls: Any = None
    ) -> Any:
        """The SDK's request, with this call's deadline and identity fixed before its first attempt."""
        return super().request(
            cast_to, prepare_call(options, self.fairserve), stream=stream, stream_cls=stream_cls
        )

    def _build_headers(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Headers:
        return add_attempt(super()._build_headers(options, retries_taken=retries_taken), retries_taken)

    def _should_retry(self, response: httpx2.Response) -> bool:
        return super()._should_retry(response) and retry_fits_deadline(
            response, self._parse_retry_after_header(response.headers)
        )

    def _sleep_for_retry(
        self,
        *,
        retries_taken: int,
        max_retries: int,
        options: FinalRequestOptions,
        response: httpx2.Response | None,
    ) -> None:
        # The SDK's own three lines (compute the back-off, sleep), with the deadline check between them.
        delay = self._calculate_retry_timeout(
            max_retries - retries_taken, options, response.headers if response is not None else None
        )
        check_sleep(options, delay, self._build_request(options, retries_taken=retries_taken))
        time.sleep(delay)


class AsyncFairServe(openai.AsyncOpenAI):
    """openai.AsyncOpenAI with the same additions as FairServe; `async with client.task() as task:`."""

    def __init__(
        self,
        *,
        deadline: Deadline | None = None,
        deadline_in: float | None = None,
        workflow_run_id: str | None = None,
        _task_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._idempotency_header = IDEMPOTENCY_HEADER
        self.fairserve = _defaults(deadline, deadline_in, workflow_run_id, _task_id)

    def copy(
        self,
        *,
        deadline: Any = _KEEP,
        deadline_in: Any = _KEEP,
        workflow_run_id: str | None = None,
        _task_id: str | None = None,
        **kwargs: Any,
    ) -> Self:
        """openai's `copy`/`with_options`, plus the fairserve defaults (inherited unless given)."""
        extra = {
            **kwargs.pop("_extra_kwargs", {}),
            **_copy_kwargs(self.fairserve, deadline, deadline_in, workflow_run_id, _task_id),
        }
        return super().copy(_extra_kwargs=extra, **kwargs)

    with_options = copy

    def task(self, task_id: str | None = None) -> AsyncTask:
        """`async with client.task() as task:` tags the calls inside with one `X-Task-Id`."""
        return AsyncTask(self, task_id)

    async def request(
        self, cast_to: Any, options: FinalRequestOptions, *, stream: bool = False, stream_cls: Any = None
    ) -> Any:
        """The SDK's request, with this call's deadline and identity fixed before its first attempt."""
        return await super().request(
            cast_to, prepare_call(options, self.fairserve), stream=stream, stream_cls=stream_cls
        )

    def _build_headers(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Headers:
        return add_attempt(super()._build_headers(options, retries_taken=retries_taken), retries_taken)

    def _should_retry(self, response: httpx2.Response) -> bool:
        return super()._should_retry(response) and retry_fits_deadline(
            response, self._parse_retry_after_header(response.headers)
        )

    async def _sleep_for_retry(
        self,
        *,
        retries_taken: int,
        max_retries: int,
        options: FinalRequestOptions,
        response: httpx2.Response | None,
    ) -> None:
        delay = self._calculate_retry_timeout(
            max_retries - retries_taken, options, response.headers if response is not None else None
        )
        check_sleep(options, delay, self._build_request(options, retries_taken=retries_taken))
        await asyncio.sleep(delay)
