"""The scheduler on its own: budgets, chunked prefill, preemption, cancellation, deadlines, invariants.

The scheduler is driven without a model: "sampling" appends a fixed token, which is all the
scheduler needs to know about a forward pass.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.kv_cache import BlockPool
from engine.core.request import FinishReason, Request, RequestMeta, RequestState
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerOutput
from tests.defaults import fcfs, scheduler_config

EOS = 0


def make_scheduler(
    num_blocks: int = 64, block_size: int = 4, budget: int = 32, seats: int = 8, watermark: int = 0
) -> Scheduler:
    cfg = scheduler_config(
        max_num_batched_tokens=budget, max_num_seqs=seats, max_model_len=4096, watermark_blocks=watermark
    )
    return Scheduler(cfg, BlockPool(num_blocks, block_size, True), fcfs())


def make_request(
    rid: str, prompt_len: int, max_tokens: int, deadline: float | None = None, arrival: float = 0.0
) -> Request:
    prompt = [1 + (hash((rid, i)) % 50) for i in range(prompt_len)]
    meta = RequestMeta(tenant_id="t", deadline=deadline, arrival_time=arrival)
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), meta)


def run_step(s: Scheduler, now: float = 0.0) -> tuple[SchedulerOutput, list[Request]]:
    out = s.schedule(now)
    sampled = {c.request.request_id: 7 for c in out.chunks if c.samples}
    finished = s.update(out, sampled, {EOS})
    return out, finished


def check_output(s: Scheduler, out: SchedulerOutput) -> None:
    assert out.num_batched_tokens <= s.config.max_num_batched_tokens
    assert len(out.chunks) <= s.config.max_num_seqs
    assert len(s.running) <= s.config.max_num_seqs
    ids = [c.request.request_id for c in out.chunks]
    assert len(ids) == len(set(ids)), "a request scheduled twice in one iteration"
    s.pool.check_invariants()
    # Blocks may be shared only when they are full cached prefix blocks.
    owners = Counter(b for t in s.pool.tables.values() for b in t.block_ids)
    for block_id, n in owners.items():
        if n > 1:
            assert s.pool.blocks[block_id].block_hash is not None, f"block {block_id} owned twice"


def test_long_prompt_is_prefilled_in_chunks_within_budget() -> None:
    s = make_scheduler(budget=16)
    s.add(make_request("a", 50, 3))
    chunks: list[tuple[int, int]] = []
    while s.has_unfinished():
        out, _ = run_step(s)
        check_output(s, out)
        chunks.extend((c.start, c.length) for c in out.chunks)
    assert chunks[:4] == [(0, 16), (16, 16), (32, 16), (48, 2)]
    assert [length for _, length in chunks[4:]] == [1, 1]  # two decodes after the first sampled token


def test_decodes_are_scheduled_before_new_prefill() -> None:
    s = make_scheduler(budget=8)
    s.add(make_request("a", 4, 10))
    run_step(s)  # a prefilled, sampled its first token
    s.add(make_request("b", 30, 2))
    out, _ = run_step(s)
    assert out.chunks[0].request.request_id == "a" and out.chunks[0].length == 1
    assert out.chunks[1].request.request_id == "b" and out.chunks[1].length == 7


def test_max_num_seqs_caps_admission() -> None:
    s = make_scheduler(seats=2, budget=100)
    for i in range(5):
        s.add(make_request(f"r{i}", 3, 2))
    out, _ = run_step(s)
    assert len(out.chunks) == 2
    assert s.num_waiting == 3


def test_preemption_by_recompute_records_victim_and_tokens() -> None:
    s = make_scheduler(num_blocks=8, block_size=4, budget=64)
    s.add(make_request("a", 8, 20, arrival=0.0))
    s.add(make_request("b", 8, 20, arrival=1.0))
    preemptions = []
    while s.has_unfinished():
        out, _ = run_step(s)
        check_output(s, out)
        preemptions.extend(out.preempted)
    assert preemptions, "eight blocks cannot hold two 28-token requests"
    victim, record = preemptions[0]
    assert victim.request_id == "b"  # FCFS preempts the latest arrival
    assert record.mode == "recompute" and record.reason == "kv_blocks_exhausted"
    assert record.tokens_recomputed > 8
    # Prefix-cached blocks that survived the preemption need no recompute.
    assert 0 < victim.recomputed_tokens <= record.tokens_recomputed
    assert s.pool.num_free == s.pool.num_blocks


def test_abort_in_each_state_frees_blocks() -> None:
    s = make_scheduler(budget=8, seats=2)
    s.add(make_request("decoding", 4, 50))
    s.add(make_request("prefilling", 40, 5))
    s.add(make_request("queued", 4, 5))
    run_step(s)
    run_step(s)
    states = {r.request_id: r.phase for r in s.requests.values()}
    assert states == {"decoding": "decode", "prefilling": "prefill", "queued": "waiting"}
    for rid in states:
        assert s.abort(rid)
    out, _ = run_step(s)
    assert {r.request_id for r in out.finished} == set(states)
    assert all(r.finish_reason is FinishReason.CANCELLED for r in out.finished)
    assert {r.request_id: r.cancel_state for r in out.finished} == states
    assert s.pool.num_free == s.pool.num_blocks and not s.has_unfinished()


def test_deadline_expires_queued_and_running_requests() -> None:
    s = make_scheduler(budget=8, seats=1)
    s.add(make_request("running", 4, 100, deadline=10.0))
    s.add(make_request("queued", 4, 5, deadline=5.0))
    for t in range(3):
        run_step(s, now=float(t))
    produced = len(s.requests["running"].output_token_ids)
    assert produced > 0
    out, _ = run_step(s, now=5.0)
    assert [r.request_id for r in out.finished] == ["queued"]
    assert out.finished[0].num_computed_tokens == 0  # never prefilled
    out, _ = run_step(s, now=10.0)
    assert [r.request_id for r in out.finished] == ["running"]
    assert out.finished[0].finish_reason is FinishReason.DEADLINE
    assert len(out.finished[0].output_token_ids) >= produced  # partial output kept
    assert s.deadline_misses == {"waiting": 1, "running": 1}
    assert s.pool.num_free == s.pool.num_blocks


def test_a_partial_request_ends_at_its_deadline_as_length_with_its_tokens() -> None:
    s = make_scheduler(budget=8, seats=2)
    partial = make_request("partial", 4, 100, deadline=10.0)
    partial.meta.partial_at_deadline = True
    s.add(partial)
    late = make_request("unstarted", 4, 5, deadline=10.0)  # no token yet: nothing partial to give
    late.meta.partial_at_deadline = True
    for t in range(3):
        run_step(s, now=float(t))
    s.add(late)
    out, _ = run_step(s, now=10.0)
    reasons = {r.request_id: r.finish_reason for r in out.finished}
    assert reasons == {"partial": FinishReason.LENGTH, "unstarted": FinishReason.DEADLINE}
    assert 0 < len(partial.output_token_ids) < 100
    assert s.deadline_misses == {"waiting": 1, "running": 0}  # an answer given is not a miss
    assert s.pool.num_free == s.pool.num_blocks


def test_a_partial_answer_leaves_one_step_before_its_deadline() -> None:
    s = make_scheduler(budget=16, seats=2)
    partial = make_request("partial", 4, 100, deadline=10.0)
    partial.meta.partial_at_deadline = True
    plain = make_request("plain", 4, 100, deadline=10.0)
    s.add(partial)
    s.add(plain)
    for t in range(9):  # steps of one second
        run_step(s, now=float(t))
    out, _ = run_step(s, now=9.2)  # this step would end at 10.2: the partial answer is due now
    assert [(r.request_id, r.finish_reason) for r in out.finished] == [("partial", FinishReason.LENGTH)]
    out, _ = run_step(s, now=10.0)
    assert [(r.request_id, r.finish_reason) for r in out.finished] == [("plain", FinishReason.DEADLINE)]


def test_prefix_cache_hit_skips_prefill_and_counts_cached_tokens() -> None:
    s = make_scheduler(budget=64)
    shared = make_request("a", 20, 1)
    s.add(shared)
    while s.has_unfinished():
        run_step(s)
    twin = Request(
        "b", list(shared.prompt_token_ids), SamplingParams(max_tokens=1), RequestMeta(tenant_id="t")
    )
    s.add(twin)
    out, _ = run_step(s)
    assert twin.num_cached_tokens == 16  # four full blocks of four, last token left to compute
    assert out.chunks[0].start == 16 and out.chunks[0].length == 4


@pytest.mark.parametrize(
    ("meta", "cached"),
    [
        (RequestMeta(tenant_id="other"), 0),  # another tenant: the same tokens, different keys
        (RequestMeta(tenant_id="t", cache_salt="narrower"), 0),  # the owner, under a per-request salt
        (RequestMeta(tenant_id="other", cache_group="org"), 0),  # a group the owner is not in
    ],
)
def test_prefix_cache_is_isolated_by_tenant_and_salt(meta: RequestMeta, cached: int) -> None:
    s = make_scheduler(budget=64)
    s.add(make_request("a", 20, 1))
    while s.has_unfinished():
        run_step(s)
    probe = Request("b", _prompt_of("a", 20), SamplingParams(max_tokens=1), meta)
    s.add(probe)
    run_step(s)
    assert probe.num_cached_tokens == cached


def test_prefix_cache_is_shared_inside_a_cache_group() -> None:
    s = make_scheduler(budget=64)
    first = make_request("a", 20, 1)
    first.meta = RequestMeta(tenant_id="t", cache_group="org")
    s.add(first)
    while s.has_unfinished():
        run_step(s)
    peer = Request(
        "b", _prompt_of("a", 20), SamplingParams(max_tokens=1), RequestMeta(tenant_id="u", cache_group="org")
    )
    s.add(peer)
    run_step(s)
    assert peer.num_cached_tokens == 16


def _prompt_of(rid: str, prompt_len: int) -> list[int]:
    return make_request(rid, prompt_len, 1).prompt_token_ids


@settings(max_examples=40, deadline=None)
@given(
    arrivals=st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(1, 20), st.booleans()),
        min_size=1,
        max_size=25,
    ),
    budget=st.integers(4, 48),
    seats=st.integers(1, 6),
    num_blocks=st.integers(16, 40),
)
def test_invariants_under_random_traces(
    arrivals: list[tuple[int, int, int, bool]], budget: int, seats: int, num_blocks: int
) -> None:
    s = make_scheduler(num_blocks=num_blocks, block_size=4, budget=budget, seats=seats)
    pending = sorted(enumerate(arrivals), key=lambda x: x[1][0])
    ended: Counter[str] = Counter()
    results: dict[str, Request] = {}
    step = 0
    while pending or s.has_unfinished():
        while pending and pending[0][1][0] <= step:
            i, (_, plen, mt, cancel) = pending.pop(0)
            r = make_request(f"r{i}", plen, mt)
            r.meta.task_id = "cancel-me" if cancel else None
            results[r.request_id] = r
            s.add(r)
        if step == 12:
            for r in list(s.requests.values()):
                if r.meta.task_id == "cancel-me":
                    s.abort(r.request_id)
        out, finished = run_step(s, now=float(step))
        check_output(s, out)
        for r in finished + out.finished:
            ended[r.request_id] += 1
        step += 1
        assert step < 5000, "scheduler made no progress"
    assert s.pool.num_free == s.pool.num_blocks, "a block leaked"
    assert set(ended) == set(results) and all(n == 1 for n in ended.values()), (
        "each request ends exactly once"
    )
    for r in results.values():
        assert r.state is RequestState.FINISHED
        if r.finish_reason is FinishReason.LENGTH:
            assert len(r.output_token_ids) == r.sampling.max_tokens
        else:
            assert r.finish_reason is FinishReason.CANCELLED and r.meta.task_id == "cancel-me"
