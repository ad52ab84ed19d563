"""The engine's produced-token book: records until billed, orphans of dead gateways, hourly totals, and
all of it read back after a kill -9 (the file is appended with one write() per change)."""

from __future__ import annotations

import time
from pathlib import Path

from engine.core.outputs import OutputDelta, RequestMetrics
from engine.core.request import KV_HOLD, FinishReason, RequestMeta
from engine.serving.remote.accounting import ProducedBook


def _finish(book: ProducedBook, rid: str, owner: bytes, completion: int) -> None:
    book.opened(rid, owner, RequestMeta(tenant_id="t", ledger_id=f"caller-{rid}"))
    now = time.time()
    metrics = RequestMetrics(3, 1, completion, 1.0, 0, 0, 0, None, now - 1, now - 1, now - 1, now - 2)
    book.finished(OutputDelta(rid, [], "", True, FinishReason.LENGTH, metrics))


def test_records_wait_for_billing_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "produced.log"
    book = ProducedBook(path)
    _finish(book, "a", b"g1", 5)
    _finish(book, "b", b"g2", 7)
    book.billed(["a"])
    assert book.unconfirmed() == 1
    orphans = book.orphans(live=[b"g1"], older_than_s=0.5)
    assert [(r.engine_request_id, r.ledger_request_id) for r in orphans] == [("b", "caller-b")]
    assert book.orphans(live=[b"g1", b"g2"], older_than_s=0.0) == []
    totals = book.totals(time.time() - 10)
    assert [(t.tenant_id, t.requests, t.completion_tokens) for t in totals] == [("t", 2, 12)]
    again = ProducedBook(path)  # as after a kill -9: nothing was closed
    assert again.unconfirmed() == 1
    assert [(t.requests, t.completion_tokens) for t in again.totals(time.time() - 10)] == [(2, 12)]
    third = ProducedBook(path)  # and again, with what the second one appended
    assert [(t.requests, t.completion_tokens) for t in third.totals(time.time() - 10)] == [(2, 12)]
    assert [r.engine_request_id for r in third.orphans(live=[], older_than_s=0.0)] == ["b"]


def test_tokens_produced_beyond_what_was_billed_become_a_supplement(tmp_path: Path) -> None:
    book = ProducedBook(tmp_path / "produced.log")
    _finish(book, "a", b"g1", 9)
    book.billed(["a"], [4])  # the gateway billed 4 (it had lost the engine), the engine produced 9
    book.opened("b", b"g1", RequestMeta(tenant_id="t", ledger_id="caller-b"))
    book.billed(["b"], [0])  # billed before it ended
    now = time.time()
    metrics = RequestMetrics(3, 1, 6, 1.0, 0, 0, 0, None, now - 1, now - 1, now - 1, now - 2)
    book.finished(OutputDelta("b", [], "", True, FinishReason.CANCELLED, metrics))
    extra = {r.engine_request_id: r for r in book.orphans(live=[b"g1"], older_than_s=0.0)}
    assert {rid: (r.ledger_request_id, r.completion_tokens) for rid, r in extra.items()} == {
        "a": (None, 5),
        "b": (None, 6),
    }
    book.billed(["a", "b"])  # the supplements billed: nothing left
    assert book.unconfirmed() == 0
    assert ProducedBook(tmp_path / "produced.log").unconfirmed() == 0


def test_a_split_request_counts_once_across_its_prefill_and_decode_parts(tmp_path: Path) -> None:
    """Totals for `fairserve usage reconcile`: the prefill part counts the request, its prompt and the
    first token; the decode part (given the prompt plus that token) only the tokens it sampled."""
    now = time.time()
    prefill = ProducedBook(tmp_path / "prefill.log")
    prefill.opened("r", b"g", RequestMeta(tenant_id="t", ledger_id="caller-r", kv_handoff=KV_HOLD))
    first = RequestMetrics(5, 2, 1, 1.0, 0, 0, 0, None, now - 1, now - 1, now - 1, now - 2)
    prefill.finished(OutputDelta("r", [], "", True, FinishReason.HANDOFF, first))
    decode = ProducedBook(tmp_path / "decode.log")
    decode.opened("r", b"g", RequestMeta(tenant_id="t", ledger_id="caller-r", kv_handoff="tcp://p:1"))
    rest = RequestMetrics(6, 6, 7, 2.0, 0, 0, 0, None, now - 1, now - 1, now - 1, now - 2)
    decode.finished(OutputDelta("r", [], "", True, FinishReason.LENGTH, rest))
    for books in (
        [prefill, decode],
        [ProducedBook(tmp_path / "prefill.log"), ProducedBook(tmp_path / "decode.log")],
    ):
        parts = [t for book in books for t in book.totals(now - 10)]
        summed = [
            sum(getattr(t, f) for t in parts)
            for f in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
        ]
        assert summed == [1, 5, 2, 8]  # as the ledger's one row: 5 prompt tokens, 2 cached, 1 + 7 completion
    # Each part's own record still carries its counts, for billing it if its gateway dies.
    assert [(r.prompt_tokens, r.completion_tokens) for r in decode.orphans(live=[], older_than_s=0.0)] == [
        (6, 7)
    ]


def test_a_confirmation_said_again_leaves_the_supplement_for_its_billing(tmp_path: Path) -> None:
    book = ProducedBook(tmp_path / "produced.log")
    _finish(book, "a", b"g1", 9)
    book.billed(["a"], [4])
    book.billed(["a"], [4])  # the gateway says it again when the engine comes back (confirmations.py)
    assert [(r.engine_request_id, r.completion_tokens) for r in book.orphans([b"g1"], 0.0)] == [("a", 5)]
    book.billed(["a"])  # the gateway that bills the supplement confirms it without counts
    assert book.unconfirmed() == 0
