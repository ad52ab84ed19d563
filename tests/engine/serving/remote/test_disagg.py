"""Prefill and decode on separate `fairserve engine` processes (engine/serving/disagg.py, routing/roles.py): the
same greedy tokens and charges as one co-located engine, prefix hits on the prefill engine, cancellation
in transfer, and the kill drills (a dead prefill or decode engine fails its requests retryably, and the
prefill engine frees the KV it held for a decode engine that never pulled it)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import zmq

from engine import LLM, EngineDeadError, FinishReason, RequestMeta, RequestOutput, SamplingParams
from engine.serving.remote.curve import ClusterKey, create_key_file, serve_securely
from engine.serving.remote.liveness import SilenceBounds
from engine.serving.remote.roles import RoleAwareEngine, reachable
from routing.roles import DisaggRouter
from tests.defaults import SILENCE
from tests.engine.serving.remote.engine_process import EngineProcess

COMMON = ("--num-kv-blocks", "96", "--max-num-batched-tokens", "64")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [
    "The batch never waits.",
    "Fair share " * 30,  # longer than the token budget: a chunked prefill
    "x",
    "Prefill and decode apart, " * 8,
]


async def until(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "cluster.key"
    assert create_key_file(path)
    return path


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, key: Path
) -> Iterator[tuple[EngineProcess, EngineProcess]]:
    """A prefill engine (blocks of 16) and a decode engine (blocks of 8: the KV is re-cut on arrival),
    with a cluster key: the KV travels over CurveZMQ."""
    keyed = ("--cluster-key", str(key))
    prefill = EngineProcess(tmp_path_factory.mktemp("prefill"), *COMMON, *keyed, "--role", "prefill")
    decode = EngineProcess(
        tmp_path_factory.mktemp("decode"), *COMMON, *keyed, "--role", "decode", "--block-size", "8"
    )
    yield prefill, decode
    prefill.stop()
    decode.stop()


def router(
    prefill: EngineProcess,
    decode: EngineProcess,
    key: Path | None = None,
    silence: SilenceBounds = SilenceBounds(0.5, 1.5),  # a frozen engine is lost soon (the kill drill)
) -> DisaggRouter:
    cluster_key = ClusterKey.load(key) if key is not None else None
    engines = {p.address: RoleAwareEngine(p.address, silence, cluster_key) for p in (prefill, decode)}
    for engine in engines.values():
        engine.start()
    assert [e.role for e in engines.values()] == ["prefill", "decode"]
    assert engines[prefill.address].kv_address.startswith("tcp://127.0.0.1:")
    return DisaggRouter(
        {prefill.address: engines[prefill.address]}, {decode.address: engines[decode.address]}
    )


async def run(
    engine: DisaggRouter, prompt: str, params: SamplingParams, request_id: str, tenant: str = "t"
) -> list[RequestOutput]:
    ids = engine.tokenizer.encode(prompt)
    return [o async for o in engine.generate(ids, params, RequestMeta(tenant_id=tenant), request_id)]


# The step cost's work left uncharged at the hand-off: under one token (w_in) on the prefill engine.
CARRIED = 1.0


def run_split(
    pair: tuple[EngineProcess, EngineProcess], key: Path, requests: list[tuple[str, SamplingParams, str, str]]
) -> list[list[RequestOutput]]:
    """Each (prompt, params, request id, tenant) through one router over `pair`, all at once."""

    async def scenario() -> list[list[RequestOutput]]:
        engine = router(*pair, key)
        try:
            return await asyncio.gather(*(run(engine, *request) for request in requests))
        finally:
            engine.shutdown()

    return asyncio.run(scenario())


def test_the_same_greedy_tokens_and_charges_as_one_colocated_engine(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    llm = LLM(None, num_kv_blocks=96, max_num_batched_tokens=64)
    metas = [RequestMeta(tenant_id=f"t{i}") for i in range(len(PROMPTS))]
    reference = llm.generate(PROMPTS, GREEDY, metas)
    service = llm.engine.policy.service()  # each tenant ran one request

    requests = [(p, GREEDY, f"parity-{i}", f"t{i}") for i, p in enumerate(PROMPTS)]
    for i, outs in enumerate(run_split(pair, key, requests)):
        ref, last = reference[i], outs[-1]
        assert list(last.token_ids) == list(ref.token_ids)
        assert last.text == ref.text
        assert last.finished and last.finish_reason is FinishReason.LENGTH
        assert all(not o.finished for o in outs[:-1])
        assert outs[0].new_token_ids == [ref.token_ids[0]]  # the first token, from the prefill engine
        m = last.metrics
        assert (m.prompt_tokens, m.completion_tokens) == (len(ref.prompt_token_ids), len(ref.token_ids))
        # Each token charged once; the step cost's work (engine/core/step_cost.py) is charged in whole tokens and
        # the prefill engine's fraction is its own, so the split may charge one token's work less.
        assert service[f"t{i}"] - CARRIED <= m.charged_service <= service[f"t{i}"]


def test_the_decode_engines_graphs_give_the_eager_engines_tokens(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    """The decode engine (default settings: its decode steps go through engine/worker/decode_graphs.py, KV staged
    from another engine and re-cut to blocks of 8) gives the tokens of a co-located eager engine."""
    llm = LLM(None, num_kv_blocks=96, max_num_batched_tokens=64, enforce_eager=True)
    assert llm.engine.runner.graphs is None
    reference = llm.generate(PROMPTS, GREEDY)
    requests = [(p, GREEDY, f"eager-{i}", f"t{i}") for i, p in enumerate(PROMPTS)]
    for ref, outs in zip(reference, run_split(pair, key, requests), strict=True):
        assert list(outs[-1].token_ids) == ref.token_ids
    assert any("decode graphs:" in line for line in pair[1].output), "the decode engine set up no graphs"


def test_stop_strings_at_the_hand_off_end_as_on_one_colocated_engine(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    """Stops taken from the greedy text: one spanning the first and second tokens (the prefill part holds
    its start back, the decode part starts from it), one inside the first token, one after it, one whose
    held start never completes; and a first token that is half of "é" (logit_bias). Text, finish_reason,
    tokens and charge as co-located, streamed or not."""
    llm = LLM(None, num_kv_blocks=96, max_num_batched_tokens=64)
    prompt = PROMPTS[0]
    cut = len(llm.generate([prompt], replace(GREEDY, max_tokens=1))[0].text)  # the first token's text
    whole = llm.generate([prompt], GREEDY)[0].text
    spanning = whole[cut - 1 : cut + 1]
    assert cut >= 1 and len(spanning) == 2 and whole.find(spanning) == cut - 1
    stops = [spanning, whole[:cut], whole[cut + 1 : cut + 3], whole[cut - 1] + "\u2603"]
    cases = [replace(GREEDY, stop=[s], stream_outputs=o) for s in stops for o in (True, False)]
    cases.append(replace(cases[-1], logit_bias={0xC3: 100.0, 0xA9: 100.0}))  # "é" is C3 A9 in UTF-8
    metas = [RequestMeta(tenant_id=f"s{i}") for i in range(len(cases))]
    reference = llm.generate([prompt] * len(cases), cases, metas)
    service = llm.engine.policy.service()
    assert [r.finish_reason for r in reference[::2]] == [FinishReason.STOP] * 3 + [FinishReason.LENGTH] * 2
    assert reference[-1].token_ids[:2] == [0xC3, 0xA9] and reference[-1].text.startswith("é")

    requests = [(prompt, p, f"stop-{i}", f"s{i}") for i, p in enumerate(cases)]
    for i, outs in enumerate(run_split(pair, key, requests)):
        ref, last = reference[i], outs[-1]
        assert (last.text, last.finish_reason) == (ref.text, ref.finish_reason), i
        assert "".join(o.delta_text for o in outs) == ref.text
        assert list(last.token_ids) == ref.token_ids
        assert last.metrics.completion_tokens == len(ref.token_ids)
        assert service[f"s{i}"] - CARRIED <= last.metrics.charged_service <= service[f"s{i}"]


def test_prefix_hits_on_the_prefill_engine_still_count(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    prompt = "A shared system prompt that fills several blocks. " * 4

    async def scenario() -> tuple[list[RequestOutput], list[RequestOutput]]:
        engine = router(*pair, key)
        try:
            first = await run(engine, prompt, GREEDY, "hit-1", "hits")
            return first, await run(engine, prompt, GREEDY, "hit-2", "hits")
        finally:
            engine.shutdown()

    first, second = asyncio.run(scenario())
    assert first[-1].metrics.cached_tokens == 0
    assert second[-1].metrics.cached_tokens >= 16
    assert list(second[-1].token_ids) == list(first[-1].token_ids)


def test_a_deadline_holds_across_the_parts_and_an_abort_reaches_the_decode_part(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    long = SamplingParams(max_tokens=700, temperature=0.0, ignore_eos=True)  # the decode cache: 768

    async def scenario() -> tuple[list[RequestOutput], list[RequestOutput], bool]:
        engine = router(*pair, key)
        try:
            ids = engine.tokenizer.encode("Until the deadline.")
            meta = RequestMeta(tenant_id="t", deadline=time.time() + 1.0)
            timed = [o async for o in engine.generate(ids, long, meta, "deadline")]
            stream = engine.submit(ids, long, RequestMeta(tenant_id="t"), "aborted")
            seen: list[RequestOutput] = []
            async for out in stream:
                seen.append(out)
                if len(seen) == 3:  # decoding on the decode engine by now
                    on_decode = engine.engine_of("aborted") == pair[1].address
                    assert engine.abort("aborted")
            return timed, seen, on_decode
        finally:
            engine.shutdown()

    timed, aborted, on_decode = asyncio.run(scenario())
    assert timed[-1].finish_reason is FinishReason.DEADLINE and 1 < len(timed[-1].token_ids) < 700
    assert on_decode and aborted[-1].finish_reason is FinishReason.CANCELLED
    assert aborted[-1].metrics.cancel_state == "decode" and len(aborted[-1].token_ids) < 700


def test_cancelled_in_transfer_and_a_pull_that_never_comes(
    pair: tuple[EngineProcess, EngineProcess], key: Path
) -> None:
    """A decode engine told to pull from a socket that never answers: an abort ends the request as
    cancelled in transfer; left alone, it fails retryably after the pull timeout."""
    _, decode = pair
    ctx: zmq.Context[Any] = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    auth = serve_securely(ctx, silent, ClusterKey.load(key))  # the decode engine must get through to it
    port = silent.bind_to_random_port("tcp://127.0.0.1")

    async def scenario() -> tuple[list[RequestOutput], BaseException | None, float]:
        engine = RoleAwareEngine(decode.address, SILENCE, ClusterKey.load(key))
        engine.start()
        try:
            ids = engine.tokenizer.encode("Where is my KV?")
            meta = RequestMeta(tenant_id="t", kv_handoff=f"tcp://127.0.0.1:{port}")
            stream = engine.submit(ids, GREEDY, meta, "in-transfer")
            await until(lambda: silent.poll(0), 5, "the decode engine's pull")
            assert engine.live_request("in-transfer") is not None
            engine.abort("in-transfer")
            cancelled = [o async for o in stream]
            began = time.monotonic()
            failure = None
            try:
                [o async for o in engine.generate(ids, GREEDY, meta, "never-pulled")]
            except EngineDeadError as exc:
                failure = exc
            return cancelled, failure, time.monotonic() - began
        finally:
            engine.shutdown()
            silent.close(linger=0)
            auth.stop()
            ctx.term()

    cancelled, failure, waited = asyncio.run(scenario())
    assert cancelled[-1].finish_reason is FinishReason.CANCELLED
    assert cancelled[-1].metrics.cancel_state == "transfer"
    assert cancelled[-1].metrics.completion_tokens == 0
    assert isinstance(failure, EngineDeadError) and "KV transfer failed" in str(failure)
    assert waited >= 4.0  # the default --kv-pull-timeout (5 s), not at once


def test_kill_drill_prefill_then_decode(tmp_path: Path) -> None:
    """A frozen-then-killed prefill engine fails its requests retryably; so does a frozen decode engine,
    and the prefill engine frees the KV it held for it after --kv-hold-timeout."""
    prefill = EngineProcess(tmp_path / "p", *COMMON, "--role", "prefill", "--kv-hold-timeout", "3")
    decode = EngineProcess(tmp_path / "d", *COMMON, "--role", "decode")
    try:

        async def scenario() -> tuple[list[BaseException | None], list[int]]:
            engine = router(prefill, decode)
            clients = engine.clients()
            failures: list[BaseException | None] = []
            used: list[int] = []
            try:
                assert (await run(engine, "warm up", GREEDY, "warm"))[-1].finished
                await until(lambda: clients[0].stats().kv_blocks_used == 0, 5, "the warm-up's KV freed")
                os.kill(decode.proc.pid, signal.SIGSTOP)
                try:
                    await run(engine, "The decode engine is gone. " * 3, GREEDY, "lost-decode")
                    failures.append(None)
                except EngineDeadError as exc:
                    failures.append(exc)
                used.append(clients[0].stats().kv_blocks_used)  # held for a pull that never comes
                await until(lambda: clients[0].stats().kv_blocks_used == 0, 10, "the held KV freed")
                used.append(clients[0].stats().kv_blocks_used)
                decode.kill()
                os.kill(prefill.proc.pid, signal.SIGSTOP)
                try:
                    await run(engine, "The prefill engine is gone.", GREEDY, "lost-prefill")
                    failures.append(None)
                except EngineDeadError as exc:
                    failures.append(exc)
                prefill.kill()
                return failures, used
            finally:
                engine.shutdown()

        failures, used = asyncio.run(scenario())
        assert all(isinstance(f, EngineDeadError) for f in failures), failures
        assert used[0] > 0 and used[1] == 0
    finally:
        prefill.kill()
        decode.kill()


def test_both_parts_charge_one_fair_share_through_the_shared_counters(tmp_path: Path) -> None:
    """With --redis on both engines, the service the two engines publish for a tenant adds up to what its
    requests were charged: the prompt on the prefill engine, the output on the decode engine, once each."""
    prefix = f"fs-disagg-{uuid.uuid4().hex}"
    shared = ("--redis", "redis://127.0.0.1:6379/0", "--counter-sync-prefix", prefix)
    prefill = EngineProcess(tmp_path / "p", *COMMON, *shared, "--role", "prefill")
    decode = EngineProcess(tmp_path / "d", *COMMON, *shared, "--role", "decode")
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0", decode_responses=True)
    try:

        async def scenario() -> float:
            engine = router(prefill, decode)
            try:
                outs = await asyncio.gather(
                    *(run(engine, p, GREEDY, f"c-{i}", "a") for i, p in enumerate(PROMPTS))
                )
                # An engine publishes its counters at the start of a step (engine/serving/counter_sync.py): another
                # tenant's request, after the sync interval, makes both engines step and publish a's last.
                await asyncio.sleep(0.3)
                await run(engine, "z", GREEDY, "c-z", "z")
                return sum(o[-1].metrics.charged_service for o in outs)
            finally:
                engine.shutdown()

        charged = asyncio.run(scenario())

        def published() -> dict[str, float]:
            return {k: float(client.hget(k, "0:a") or 0) for k in client.scan_iter(f"{prefix}:service:*")}

        deadline = time.monotonic() + 10
        while not (len(published()) == 2 and sum(published().values()) == pytest.approx(charged)):
            assert time.monotonic() < deadline, (published(), charged)
            time.sleep(0.05)
        parts = sorted(published().values())
        assert parts[0] > 0  # each engine charged its part
    finally:
        prefill.stop()
        decode.stop()
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()


def test_a_wildcard_kv_address_is_dialled_on_the_engines_own_host() -> None:
    assert reachable("tcp://0.0.0.0:7001", "tcp://10.0.0.5:5555") == "tcp://10.0.0.5:7001"
    assert reachable("tcp://[::]:7001", "tcp://[fd00::5]:5555") == "tcp://[fd00::5]:7001"
    assert reachable("tcp://10.0.0.9:7001", "tcp://10.0.0.5:5555") == "tcp://10.0.0.9:7001"


def test_a_draining_prefill_engine_waits_for_the_kv_it_holds(tmp_path: Path) -> None:
    """SIGTERM while a decode engine has not pulled: the prefill engine stops only once the hold ends
    (here: it expires, and says so), not at once with the KV its request still needs."""
    prefill = EngineProcess(tmp_path / "p", *COMMON, "--role", "prefill", "--kv-hold-timeout", "2")
    decode = EngineProcess(tmp_path / "d", *COMMON, "--role", "decode")
    try:

        async def scenario() -> BaseException | None:
            engine = router(prefill, decode)
            try:
                os.kill(decode.proc.pid, signal.SIGSTOP)
                try:
                    await run(engine, "Held while draining. " * 3, GREEDY, "held")
                except EngineDeadError as exc:
                    return exc
                return None
            finally:
                engine.shutdown()

        failure = asyncio.run(scenario())
        assert isinstance(failure, EngineDeadError)
        prefill.terminate()
        assert prefill.wait(30) == 0
        assert any("was not pulled within" in line for line in prefill.output), prefill.output[-10:]
    finally:
        prefill.kill()
        decode.kill()
