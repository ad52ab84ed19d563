"""LazyQueue: FIFO order, head insertion, O(1) removal by request id, bounded stale entries."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairness import DuplicateItemError
from fairness.queue import LazyQueue
from tests.fairness.stand_in import job


def test_fifo_with_front_insertion_and_removal() -> None:
    queue: LazyQueue[Any] = LazyQueue()
    a, b, c = job("a"), job("b"), job("c")
    queue.push(a)
    queue.push(b)
    queue.push(c, front=True)
    assert queue.discard(a) and not queue.discard(a)
    assert [i.request_id for i in queue] == ["c", "b"]
    assert queue.head() is c and len(queue) == 2 and "b" in queue and "a" not in queue
    with pytest.raises(DuplicateItemError):
        queue.push(job("b"))


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=200))
def test_matches_a_list_model_and_stays_compact(ops: list[tuple[bool, int]]) -> None:
    queue: LazyQueue[Any] = LazyQueue()
    model: list[str] = []
    for push, index in ops:
        rid = f"r{index}"
        if push and rid not in model:
            queue.push(job(rid))
            model.append(rid)
        elif not push:
            assert queue.discard(job(rid)) == (rid in model)
            if rid in model:
                model.remove(rid)
        head = queue.head()
        assert (head.request_id if head else None) == (model[0] if model else None)
        assert len(queue._entries) <= 2 * len(model) + 33
    assert [i.request_id for i in queue] == model
