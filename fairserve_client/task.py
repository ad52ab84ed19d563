"""Tasks: a group of calls the server can cancel as one (`X-Task-Id`, `POST /v1/tasks/{id}/cancel`).

An agent fans out parallel attempts or sub-questions; when it gives up on them (an exception, or
it has what it needs) the siblings still running on the server are wasted work. `with
client.task() as task:` tags every call made inside the block, and cancels the whole task on the
server when the block raises or when `task.cancel()` is called. The tag travels in a context
variable, so asyncio tasks created inside the block carry it; a thread pool does not copy context
by itself, so threads use `task.client`, a copy of the client bound to the task.
"""

from __future__ import annotations

import logging
import uuid
from contextvars import ContextVar, Token
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from openai import NotFoundError

if TYPE_CHECKING:
    from fairserve_client.client import AsyncFairServe, FairServe

log = logging.getLogger(__name__)
_CURRENT: ContextVar[str | None] = ContextVar("fairserve_task_id", default=None)


def current_task_id() -> str | None:
    """The task id of the innermost `with client.task()` block in this context, if any."""
    return _CURRENT.get()


def new_task_id() -> str:
    """A fresh task id (the server accepts letters, digits and `._:-`)."""
    return f"task-{uuid.uuid4().hex}"


def _cancelled_ids(body: Any) -> list[str]:
    ids = body.get("cancelled") if isinstance(body, dict) else None
    return [str(i) for i in ids] if isinstance(ids, list) else []


class _TaskScope:
    """What the sync and async tasks share: the id, the context variable, the cancel bookkeeping."""

    def __init__(self, task_id: str | None) -> None:
        self.id = task_id or new_task_id()
        self.cancelled: list[str] = []  # request ids the server reported cancelled
        self.cancel_sent = False
        self._token: Token[str | None] | None = None

    @property
    def _path(self) -> str:
        return f"/tasks/{quote(self.id, safe='')}/cancel"

    def _enter(self) -> None:
        self._token = _CURRENT.set(self.id)

    def _leave(self) -> None:
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None


class Task(_TaskScope):
    """`with client.task() as task:` on a FairServe client (see the module docstring)."""

    def __init__(self, client: FairServe, task_id: str | None = None) -> None:
        super().__init__(task_id)
        self.client: FairServe = client.with_options(_task_id=self.id)

    def cancel(self) -> list[str]:
        """Cancel every live request of this task on the server; returns the request ids it cancelled."""
        self.cancel_sent = True
        try:
            body = self.client.post(self._path, cast_to=object, body={})
        except NotFoundError:  # nothing of this task is running any more
            return []
        ids = _cancelled_ids(body)
        self.cancelled.extend(ids)
        return ids

    def __enter__(self) -> Task:
        self._enter()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._leave()
        if exc_type is not None:
            try:
                self.cancel()
            except (
                Exception
            ):  # the caller's exception is the one that matters; the server ends work on its own
                log.warning("could not cancel task %s", self.id, exc_info=True)


class AsyncTask(_TaskScope):
    """`async with client.task() as task:` on an AsyncFairServe client (see the module docstring)."""

    def __init__(self, client: AsyncFairServe, task_id: str | None = None) -> None:
        super().__init__(task_id)
        self.client: AsyncFairServe = client.with_options(_task_id=self.id)

    async def cancel(self) -> list[str]:
        """Cancel every live request of this task on the server; returns the request ids it cancelled."""
        self.cancel_sent = True
        try:
            body = await self.client.post(self._path, cast_to=object, body={})
        except NotFoundError:
            return []
        ids = _cancelled_ids(body)
        self.cancelled.extend(ids)
        return ids

    async def __aenter__(self) -> AsyncTask:
        self._enter()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._leave()
        if exc_type is not None:
            try:
                await self.cancel()
            except Exception:
                log.warning("could not cancel task %s", self.id, exc_info=True)
