"""The engine's own account of what it produced, kept until a gateway confirms the ledger row.

Why the engine keeps one: a gateway killed mid-request never writes the row of the requests it had in
flight, though the engine computed their tokens (and the client may have seen some). So the engine
server records, per finished request, the tokens it produced (prompt computed, cached, completion) and
holds the record until the gateway that submitted it says the row is in its ledger (`Billed`). Records
whose gateway is gone (reaped by the socket thread) are handed to any gateway that asks (`AskProduced`):
it bills them with status `interrupted` and confirms them in turn. The per-tenant totals (by hour, since
the engine started) are what `fairserve usage reconcile` compares the ledger with.

Thread-safe: the loop (or its publisher thread) opens and finishes records, the socket thread reads them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec

from engine.core.outputs import OutputDelta
from engine.core.request import RequestMeta

log = logging.getLogger(__name__)
_HOUR_S = 3600
_JSON = msgspec.json.Encoder()


class ProducedRecord(msgspec.Struct, array_like=True):
    """One finished request as the engine saw it: whose, and the tokens it produced."""

    engine_request_id: str
    ledger_request_id: str | None  # the caller's request id (the ledger's key within its tenant)
    tenant_id: str
    api_key_id: str | None
    task_id: str | None
    workflow_run_id: str | None
    attempt: int
    finish_reason: str | None
    cancel_state: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    charged_service: float
    tokens_after_cancel: int
    preemptions: int
    recomputed_tokens: int
    arrival_time: float
    finished_time: float
    decode_part: bool = (
        False  # of a split request (engine/serving/disagg.py): its prefill part counts the request
    )
    # The ZeroMQ identity of the peer that submitted it (a gateway's `gateway_id`; "" on records older
    # than it). A gateway bills a dead peer's records only when the peer was a gateway of its deployment
    # (gateway/ops/produced.py): a raw peer's work on an engine without a cluster key is never billed.
    submitter: str = ""


class TenantProduced(msgspec.Struct, array_like=True):
    """One tenant's produced tokens over the asked period (requests finished in it)."""

    tenant_id: str
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


class ProducedBook:
    """Open requests (owner and meta), finished unconfirmed records, and per-tenant hourly totals.

    With a `path` the book survives a kill -9 of the engine: each finished record and each confirmation
    is appended there with one write() (as the ledger's journal, billing/journal.py), and a new book on
    the same path reads it back. The file is not compacted: about 300 bytes per request.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[bytes, RequestMeta]] = {}
        self._records: dict[str, tuple[bytes, ProducedRecord]] = {}
        self._hours: dict[tuple[str, int], TenantProduced] = {}
        self._early: dict[str, int] = {}  # open request -> completion tokens its gateway already billed
        self._fd: int | None = None
        if path is not None:
            self._load(path)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _append(self, doc: dict[str, Any]) -> None:
        if self._fd is not None:
            os.write(self._fd, _JSON.encode(doc) + b"\n")

    def _count(self, record: ProducedRecord) -> None:
        key = (record.tenant_id, int(record.finished_time) // _HOUR_S)
        total = self._hours.setdefault(key, TenantProduced(record.tenant_id))
        total.completion_tokens += record.completion_tokens
        if record.decode_part:  # the prefill part counted the request, its prompt and its first token
            return
        total.requests += 1
        total.prompt_tokens += record.prompt_tokens
        total.cached_tokens += record.cached_tokens

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        for line in path.read_bytes().splitlines():
            try:
                doc = msgspec.json.decode(line, type=dict[str, Any])
                if "f" in doc or "r" in doc:  # f: finished (counted); r: carried over by a compaction
                    owner, fields = doc.get("f") or doc["r"]
                    record = msgspec.convert(fields, ProducedRecord)
                    self._records[record.engine_request_id] = (bytes.fromhex(owner), record)
                    if "f" in doc:
                        self._count(record)
                elif "b" in doc:
                    for rid in doc["b"]:
                        self._records.pop(rid, None)
                elif "h" in doc:
                    tenant, hour, *counts = doc["h"]
                    self._hours[(tenant, hour)] = TenantProduced(tenant, *counts)
            except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError, ValueError):
                log.error("skipping an unreadable line of %s", path)  # torn by a crash mid-write

    def opened(self, request_id: str, owner: bytes, meta: RequestMeta) -> None:
        """A gateway's submit was accepted."""
        with self._lock:
            self._open[request_id] = (owner, meta)

    def refused(self, request_id: str) -> None:
        """The engine refused the submit after all: nothing was produced."""
        with self._lock:
            self._open.pop(request_id, None)

    def finished(self, delta: OutputDelta) -> None:
        """The request ended: keep its record until Billed, and count it for its tenant."""
        with self._lock:
            opened = self._open.pop(delta.request_id, None)
            if opened is None:
                return
            owner, meta = opened
            m = delta.metrics
            record = ProducedRecord(
                delta.request_id,
                meta.ledger_id,
                meta.tenant_id,
                meta.api_key_id,
                meta.task_id,
                meta.workflow_run_id,
                meta.attempt,
                delta.finish_reason.value if delta.finish_reason is not None else None,
                m.cancel_state,
                m.prompt_tokens,
                m.cached_tokens,
                m.completion_tokens,
                m.charged_service,
                m.tokens_after_cancel,
                m.preemptions,
                m.recomputed_tokens,
                m.arrival_time,
                m.finished_time or time.time(),
                meta.decode_part,
                owner.decode("utf-8", "replace"),
            )
            self._records[delta.request_id] = (owner, record)
            self._count(record)
            self._append({"f": [owner.hex(), record]})
            early = self._early.pop(delta.request_id, None)
            if early is not None:  # its gateway billed it before the end (it had lost this engine)
                self._settle(delta.request_id, early)

    def billed(self, request_ids: list[str], completion_tokens: list[int] | None = None) -> None:
        """A gateway has the rows of these requests in its ledger (with these completion tokens, when
        given): forget their records, keeping a supplement for tokens produced beyond what was billed."""
        counts = (
            completion_tokens if completion_tokens and len(completion_tokens) == len(request_ids) else None
        )
        with self._lock:
            for i, rid in enumerate(request_ids):
                billed = counts[i] if counts is not None else None
                kept = self._records.get(rid)
                if kept is not None and not (kept[0] == b"" and billed is not None):
                    # A supplement (owner b"") is settled only by the count-less confirmation of the gateway
                    # that bills it, never by its request's own confirmation said again (confirmations.py).
                    self._settle(rid, billed)
                elif kept is None and billed is not None and rid in self._open:
                    self._early[rid] = billed  # billed before it ended: settled when it ends

    def _settle(self, rid: str, billed: int | None) -> None:
        """Forget a billed record; tokens it produced beyond `billed` become a supplement record of no
        gateway (billed `interrupted` under the engine's request id by whichever gateway asks)."""
        _owner, record = self._records.pop(rid)
        self._append({"b": [rid]})
        if billed is None or record.completion_tokens <= billed or record.ledger_request_id is None:
            return
        extra = msgspec.structs.replace(
            record,
            ledger_request_id=None,
            prompt_tokens=0,
            cached_tokens=0,
            charged_service=0.0,
            completion_tokens=record.completion_tokens - billed,
        )
        self._records[rid] = (b"", extra)
        self._append({"r": ["", extra]})

    def orphans(self, live: Collection[bytes], older_than_s: float) -> list[ProducedRecord]:
        """Unconfirmed records whose gateway is not connected, finished at least `older_than_s` ago."""
        cutoff = time.time() - older_than_s
        with self._lock:
            return [
                r for owner, r in self._records.values() if owner not in live and r.finished_time <= cutoff
            ]

    def unconfirmed(self) -> int:
        """Records no gateway has confirmed yet."""
        with self._lock:
            return len(self._records)

    def totals(self, since: float) -> list[TenantProduced]:
        """Per-tenant totals of requests finished in the hours from `since`'s hour on."""
        first = int(since) // _HOUR_S
        out: dict[str, TenantProduced] = {}
        with self._lock:
            for (tenant, hour), t in self._hours.items():
                if hour >= first:
                    acc = out.setdefault(tenant, TenantProduced(tenant))
                    acc.requests += t.requests
                    acc.prompt_tokens += t.prompt_tokens
                    acc.cached_tokens += t.cached_tokens
                    acc.completion_tokens += t.completion_tokens
        return sorted(out.values(), key=lambda t: t.tenant_id)
