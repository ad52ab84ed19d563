"""The errors a request is refused or ended with, each naming the field at fault (a 400 at the gateway)."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request the engine refuses before queueing it; the message names the field."""

    def __init__(self, message: str, field_name: str | None = None) -> None:
        super().__init__(message)
        self.field_name = field_name


class RequestFault(InvalidRequestError):
    """A fault found inside a step that belongs to one request's own input (its adapter, its grammar, its
    sampling): that request ends alone with finish_reason "error" and this error, which the gateway answers
    as a 400 naming `field_name` (`model` for an adapter, `response_format` or `tools` for a grammar)."""


class DuplicateRequestError(InvalidRequestError):
    """A request id that is already live in the engine."""


class PromptTooLongError(InvalidRequestError):
    """Prompt plus max_tokens does not fit in the model context."""
