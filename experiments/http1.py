"""A minimal keep-alive HTTP/1.1 client for load generation.

httpx spends about 2 ms of client CPU per request here (measured against a bare uvicorn app:
p50 2.2 ms with httpx, 0.3 ms with this client), which would be billed to the gateway in an
overhead benchmark and would steal the CPU the gateway needs on a small machine. This client does
only what the benchmark needs: POST/GET with a body, Content-Length or chunked responses, and the
time the first body chunk containing a marker (an SSE data event) arrived.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Reply:
    """Status, lower-cased headers, the whole body, and when `marker` was first seen (perf_counter)."""

    status: int
    headers: dict[str, str]
    body: bytes
    marked_at: float | None = None

    def json(self) -> Any:
        """The body parsed as JSON (any JSON value, as `json.loads` gives it)."""
        return json.loads(self.body)


@dataclass
class Http1Pool:
    """Idle keep-alive connections to one origin; a request takes one (or opens one) and returns it."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    _idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._fixed = "".join(
            f"{k}: {v}\r\n" for k, v in {"Host": f"{self.host}:{self.port}", **self.headers}.items()
        )

    async def request(
        self,
        method: str,
        path: str,
        payload: object = None,
        headers: dict[str, str] | None = None,
        marker: bytes | None = None,
    ) -> Reply:
        """Send one request and read its whole response; a stale pooled connection is retried once on a new one."""
        body = b"" if payload is None else json.dumps(payload).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\n{self._fixed}{extra}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for attempt in (0, 1):
            conn = self._take() if attempt == 0 else None
            reader, writer = conn or await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(head + body)
                reply, keep = await _read_reply(reader, marker)
            except (ConnectionError, asyncio.IncompleteReadError):
                writer.close()
                if conn is not None:
                    continue  # the server closed an idle connection as we used it; nothing was processed
                raise
            if keep:
                self._idle.append((reader, writer))
            else:
                writer.close()
            return reply
        raise AssertionError("unreachable")

    def _take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """An idle connection the server has not closed (uvicorn drops idle ones after 5 s), or None."""
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def prewarm(self, n: int) -> None:
        """Open connections until `n` are idle, so the measured requests do not pay for TCP set-up."""
        while len(self._idle) < n:
            self._idle.append(await asyncio.open_connection(self.host, self.port))

    async def close(self) -> None:
        """Close every idle connection."""
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


async def _read_reply(reader: asyncio.StreamReader, marker: bytes | None) -> tuple[Reply, bool]:
    """One response off the wire, and whether the connection may be reused."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    status = int(status_line.split(" ", 2)[1])
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    marked_at = None
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
        if marker is not None and marker in body:
            marked_at = time.perf_counter()
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            if marked_at is None and marker is not None and marker in chunk:
                marked_at = time.perf_counter()
            chunks.append(chunk[:-2])
        body = b"".join(chunks)
    else:  # delimited by close
        body = await reader.read()
        headers["connection"] = "close"
    keep = headers.get("connection", "").lower() != "close"
    return Reply(status, headers, body, marked_at), keep
