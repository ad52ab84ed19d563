"""OpenAI-shaped error bodies and the one exception type routes raise to produce them.

Every error that tells the client to come back does so in a form clients obey: `Retry-After` (whole
seconds) and `retry-after-ms`, capped at `RETRY_AFTER_CAP_S`. openai-python gives up on a
`Retry-After` over 120 s and anthropic-sdk-python falls back to its own short back-off above 60 s,
so a longer header would be ignored or would make the client hammer the server (admission keeps its
jitter within the cap, admission/backoff.py); a wait really longer than that becomes
a 503 whose message says when to come back, with `x-should-retry: false`, which both SDKs obey.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from starlette.responses import Response

from admission.backoff import RETRY_AFTER_CAP_S

# OpenAI's `type` field by HTTP status; codes below are fairserve's machine-readable reasons.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def retry_after_headers(headers: Mapping[str, str]) -> tuple[dict[str, str], int | None]:
    """`headers` with `Retry-After` completed by `retry-after-ms`; the wait when it is over the cap.

    A wait over `RETRY_AFTER_CAP_S` loses both headers (the caller turns it into a 503 that says so).
    """
    out = dict(headers)
    raw = out.get("Retry-After")
    if raw is None:
        return out, None
    seconds = max(int(raw), 0)
    if seconds > RETRY_AFTER_CAP_S:
        del out["Retry-After"]
        out["x-should-retry"] = "false"
        return out, seconds
    out["retry-after-ms"] = str(seconds * 1000)
    return out, None


class APIError(Exception):
    """An error the client should see as `{"error": {"message", "type", "param", "code"}}`.

    A `Retry-After` header gets `retry-after-ms` beside it; one over `RETRY_AFTER_CAP_S` turns the
    error into a 503 that names the wait in its message and tells clients not to retry (module doc).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        capped, too_long = retry_after_headers(headers or {})
        if too_long is not None:
            back = datetime.fromtimestamp(time.time() + too_long, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status = 503
            message = (
                f"{message}; the wait ({too_long} s) is longer than the {RETRY_AFTER_CAP_S} s a "
                f"Retry-After may ask, so do not retry before {back}"
            )
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = capped


def error_body(
    status: int, message: str, code: str | None = None, param: str | None = None
) -> dict[str, object]:
    """The OpenAI error JSON object."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(err: APIError) -> Response:
    """Render an APIError as a JSON response with its headers."""
    body = json.dumps(error_body(err.status, err.message, err.code, err.param)).encode()
    return Response(body, status_code=err.status, headers=err.headers, media_type="application/json")
