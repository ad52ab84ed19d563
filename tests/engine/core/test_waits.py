"""Every wait is a request state inside the scheduler (engine/core/waits.py): a held request is live (abort,
deadlines and refusals find it there), holds no seat, no block and no place in the fairness order, and
goes through the waits in order before it is queued."""

from __future__ import annotations

from collections.abc import Sequence

from engine.core.errors import InvalidRequestError
from engine.core.kv_cache import BlockPool
from engine.core.request import FinishReason, Request, RequestState
from engine.core.scheduler import Scheduler
from tests.defaults import fcfs, scheduler_config
from tests.engine.core.test_scheduler import make_request, run_step


class Gate:
    """A wait that holds the requests named in `holds` until the test opens or fails them (the adapter's
    load or the grammar's compile stand here, on their own threads)."""

    def __init__(self, state: RequestState, holds: set[str]) -> None:
        self.state = state
        self.holds = holds
        self.held: dict[str, Request] = {}
        self.opened: list[Request] = []
        self.failed: list[tuple[Request, InvalidRequestError]] = []
        self.released: list[str] = []
        self.forgotten: list[str] = []

    def hold(self, request: Request, members: Sequence[Request]) -> bool:
        if request.request_id not in self.holds:
            return False
        self.held[request.request_id] = request
        return True

    def open(self, request_id: str) -> None:
        self.opened.append(self.held.pop(request_id))

    def fail(self, request_id: str) -> None:
        self.failed.append((self.held.pop(request_id), InvalidRequestError("it broke", "model")))

    def admit(self) -> list[Request]:
        opened, self.opened = self.opened, []
        return opened

    def take_refused(self) -> list[tuple[Request, InvalidRequestError]]:
        failed, self.failed = self.failed, []
        return failed

    def release(self, request_id: str) -> Request | None:
        self.released.append(request_id)
        return self.held.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)


def state(request: Request) -> RequestState:
    return request.state  # (read afresh: the scheduler moves it between asserts)


def make(holds_adapter: set[str], holds_grammar: set[str]) -> tuple[Scheduler, Gate, Gate]:
    adapter = Gate(RequestState.WAITING_FOR_ADAPTER, holds_adapter)
    grammar = Gate(RequestState.WAITING_FOR_GRAMMAR, holds_grammar)
    cfg = scheduler_config(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=4096, watermark_blocks=0)
    scheduler = Scheduler(cfg, BlockPool(64, 4, True), fcfs(), waits=(adapter, grammar))
    return scheduler, adapter, grammar


def test_a_held_request_is_live_without_a_seat_a_block_or_a_place_in_the_queue() -> None:
    s, adapter, grammar = make({"a"}, {"a"})
    s.add(make_request("a", 8, 3))
    s.add(make_request("b", 8, 3))
    out, _ = run_step(s)
    held = s.requests["a"]
    assert held.state is RequestState.WAITING_FOR_ADAPTER and s.num_held == 1
    assert [c.request.request_id for c in out.chunks] == ["b"]
    assert not s.pool.block_ids("a") and len(s.policy) == 0
    adapter.open("a")  # on to the next wait: its grammar
    run_step(s)
    assert state(held) is RequestState.WAITING_FOR_GRAMMAR and "a" in grammar.held
    grammar.open("a")
    out, _ = run_step(s)
    assert state(held) is RequestState.RUNNING and "a" in [c.request.request_id for c in out.chunks]
    assert s.num_held == 0


def test_abort_and_deadline_end_a_held_request_in_the_scheduler_and_release_its_wait() -> None:
    s, adapter, grammar = make({"cancelled"}, {"late"})
    s.add(make_request("cancelled", 4, 3))
    s.add(make_request("late", 4, 3, deadline=5.0))
    assert s.abort("cancelled")
    out, _ = run_step(s, now=1.0)
    assert [(r.request_id, r.finish_reason) for r in out.finished] == [("cancelled", FinishReason.CANCELLED)]
    assert out.finished[0].cancel_state == "waiting" and adapter.released == ["cancelled"]
    out, _ = run_step(s, now=6.0)
    assert [(r.request_id, r.finish_reason) for r in out.finished] == [("late", FinishReason.DEADLINE)]
    assert grammar.released == ["late"] and not s.has_unfinished() and s.num_held == 0


def test_a_failed_wait_refuses_its_request_once_and_the_waits_before_let_go_of_it() -> None:
    s, adapter, grammar = make({"r"}, {"r"})
    s.add(make_request("r", 4, 3))
    adapter.open("r")
    run_step(s)
    grammar.fail("r")
    out, _ = run_step(s)
    refused = s.take_refused()
    assert [(r.request_id, e.field_name) for r, e in refused] == [("r", "model")]
    assert refused[0][0].finish_reason is FinishReason.REJECTED and not out.finished
    assert "r" in adapter.forgotten and not s.has_unfinished() and not s.take_refused()


def test_a_request_held_from_outside_goes_on_through_the_waits_then_queues() -> None:
    s, adapter, _ = make({"pulled"}, set())
    request = make_request("pulled", 8, 3)
    s.hold(request, RequestState.WAITING_FOR_KV)
    assert request.phase == "transfer" and s.num_held == 1
    run_step(s)
    assert request.state is RequestState.WAITING_FOR_KV
    s.queue_held(request)
    assert state(request) is RequestState.WAITING_FOR_ADAPTER  # its adapter next
    adapter.open("pulled")
    out, _ = run_step(s)
    assert [c.request.request_id for c in out.chunks] == ["pulled"]
    dropped = make_request("dropped", 8, 3)
    s.hold(dropped, RequestState.WAITING_FOR_KV)
    assert s.unhold("dropped") is dropped and "dropped" not in s.requests and s.num_held == 0
