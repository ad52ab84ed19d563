"""OpenAI-shaped error bodies and the one exception type routes raise to produce them."""

from __future__ import annotations

import json
from collections.abc import Mapping

from starlette.responses import Response

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


class APIError(Exception):
    """An error the client should see as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict[str, object]:
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
