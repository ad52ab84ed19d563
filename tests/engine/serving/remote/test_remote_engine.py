"""RemoteEngine against a real `fairserve engine` process over TCP: parity, isolation between gateways,
a silent gateway's requests reaped, kill -9 and rejoin, and a SIGTERM drain."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from engine import (
    LLM,
    DuplicateRequestError,
    EngineDeadError,
    FinishReason,
    RequestMeta,
    RequestOutput,
    SamplingParams,
)
from engine.core.outputs import OutputDelta
from engine.serving.boundary.messages import Abort, IterationReport, Submit
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.liveness import SilenceBounds
from engine.serving.remote.messages import FromServer, Hello
from engine.worker.loader import default_model_dir
from tests.defaults import HEARTBEAT_TIMEOUT_S, SILENCE
from tests.engine.serving.remote.engine_process import EngineProcess

ENGINE_ARGS = ("--num-kv-blocks", "96", "--max-num-batched-tokens", "64")
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=1500, temperature=0.0, ignore_eos=True)
PROMPTS = ["The batch never waits.", "Fair share", "x"]


class Recording(RemoteEngine):
    """A RemoteEngine that also notes the request id of every output the engine sent it."""

    def __init__(self, address: str, silence: SilenceBounds = SILENCE) -> None:
        super().__init__(address, silence)
        self.seen: set[str] = set()

    def _dispatch(self, msg: Any) -> None:
        if isinstance(msg, IterationReport):
            self.seen.update(d.request_id for d in msg.outputs)
        super()._dispatch(msg)


async def until(condition: Callable[[], Any], timeout: float, what: str) -> None:
    """Wait on the running loop for `condition`, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


async def drain(stream: AsyncIterator[RequestOutput]) -> None:
    """Read a stream to its end (or its error)."""
    async for _ in stream:
        pass


async def collect(
    engine: RemoteEngine, prompt: str, params: SamplingParams, request_id: str, tenant: str = "t"
) -> list[RequestOutput]:
    ids = engine.tokenizer.encode(prompt)
    return [out async for out in engine.generate(ids, params, RequestMeta(tenant_id=tenant), request_id)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    proc = EngineProcess(tmp_path_factory.mktemp("engine"), *ENGINE_ARGS, "--gateway-timeout", "1")
    yield proc
    proc.stop()


def test_streams_the_same_greedy_tokens_as_llm(served: EngineProcess) -> None:
    reference = LLM(None, num_kv_blocks=96, max_num_batched_tokens=64).generate(PROMPTS, GREEDY)

    async def scenario() -> list[list[RequestOutput]]:
        engine = RemoteEngine(served.address, SILENCE)
        engine.start()
        try:
            assert engine.engine_id == served.engine_id and engine.is_alive
            return await asyncio.gather(
                *(collect(engine, p, GREEDY, f"parity-{i}", f"t{i}") for i, p in enumerate(PROMPTS))
            )
        finally:
            engine.shutdown()

    for want, outs in zip(reference, asyncio.run(scenario()), strict=True):
        assert outs[-1].finished and outs[-1].finish_reason == FinishReason.LENGTH
        assert list(outs[-1].token_ids) == want.token_ids
        assert "".join(o.delta_text for o in outs) == want.text


def test_choices_cross_the_socket_each_with_its_own_text(served: EngineProcess) -> None:
    """n = 3 over the remote engine's socket: each choice equals the one-choice answer, and only the last
    choice's end ends the stream, its metrics summed over the choices (what the produced book records)."""
    want = LLM(None, num_kv_blocks=96, max_num_batched_tokens=64).generate(PROMPTS[:1], GREEDY)[0]
    three = SamplingParams(**{**GREEDY.__dict__, "n": 3})

    async def scenario() -> list[RequestOutput]:
        engine = RemoteEngine(served.address, SILENCE)
        engine.start()
        try:
            return await collect(engine, PROMPTS[0], three, "choices-remote")
        finally:
            engine.shutdown()

    outs = asyncio.run(scenario())
    last = {o.index: o for o in outs}
    assert sorted(last) == [0, 1, 2]
    assert all(list(o.token_ids) == want.token_ids and o.text == want.text for o in last.values())
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished
    assert outs[-1].metrics.completion_tokens == 3 * GREEDY.max_tokens


def test_two_gateways_each_get_only_their_own_outputs(served: EngineProcess) -> None:
    async def scenario() -> tuple[Recording, Recording, list[list[RequestOutput]]]:
        a, b = Recording(served.address), Recording(served.address)
        a.start()
        b.start()
        try:
            runs = [collect(a, "from a", GREEDY, f"a-{i}") for i in range(3)]
            runs += [collect(b, "from b", GREEDY, f"b-{i}") for i in range(3)]
            outs = await asyncio.gather(*runs)
            # A request id live on one gateway is refused to the other, which cannot abort it either.
            # (Once the engine has it: a ROUTER reads its peers fairly, not in the order they sent.)
            stream = a.submit(a.tokenizer.encode("long"), LONG, RequestMeta(tenant_id="t"), "shared-id")
            assert not (await anext(stream)).finished
            with pytest.raises(DuplicateRequestError, match="already live"):
                await collect(b, "same id", GREEDY, "shared-id")
            b._send(Abort("shared-id", "cancelled"))
            assert not (await anext(stream)).finished  # outputs still come: b's abort was ignored
            stream.close()
            return a, b, outs
        finally:
            a.shutdown()
            b.shutdown()

    a, b, outs = asyncio.run(scenario())
    assert all(o[-1].finished and len(o[-1].token_ids) == GREEDY.max_tokens for o in outs)
    assert {f"a-{i}" for i in range(3)} <= a.seen and not any(s.startswith("b-") for s in a.seen)
    assert {f"b-{i}" for i in range(3)} <= b.seen and not any(s.startswith("a-") for s in b.seen)
    assert "shared-id" not in b.seen


def test_a_silent_gateways_requests_are_aborted(served: EngineProcess) -> None:
    """A gateway that submits and then says nothing (dead, frozen) stops costing engine time."""
    ctx = zmq.Context()
    silent = ctx.socket(zmq.DEALER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.connect(served.address)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(FromServer)
    silent.send(encoder.encode(Hello(uuid.uuid4().hex)))
    silent.send(encoder.encode(Submit("silent-1", [5, 6, 7], LONG, RequestMeta(tenant_id="ghost"))))

    async def scenario() -> None:
        watcher = RemoteEngine(served.address, SILENCE)
        watcher.start()
        try:
            await until(
                lambda: watcher.stats().running_by_tenant.get("ghost"), 10, "the silent request to run"
            )
            # The engine's --gateway-timeout is 1 s; the silent gateway never pings.
            await until(
                lambda: not watcher.stats().running_by_tenant.get("ghost"), 5, "the engine to abort it"
            )
        finally:
            watcher.shutdown()

    try:
        asyncio.run(scenario())
        # What the silent gateway would have read: its request ended as cancelled, not run to max_tokens.
        # The abort's report may still be on its way when the watcher's stats show the request gone.
        finals: list[OutputDelta] = []
        waited_until = time.monotonic() + 10
        while not finals and time.monotonic() < waited_until:
            if silent.poll(100):
                msg = decoder.decode(silent.recv())
                if isinstance(msg, IterationReport):
                    finals += [d for d in msg.outputs if d.finished]
        assert [d.finish_reason for d in finals] == [FinishReason.CANCELLED]
        assert finals[0].metrics is not None and finals[0].metrics.completion_tokens < LONG.max_tokens
    finally:
        silent.close(0)
        ctx.term()


def test_engine_killed_fails_in_flight_and_a_restart_rejoins(tmp_path: Path) -> None:
    first = EngineProcess(tmp_path, *ENGINE_ARGS)

    async def scenario() -> None:
        # A lost bound no test waits out: only the dropped connection can fail the request here.
        engine = RemoteEngine(first.address, SilenceBounds(HEARTBEAT_TIMEOUT_S, 600))
        engine.start()
        later: list[EngineProcess] = []
        try:
            stream = engine.submit(
                engine.tokenizer.encode("doomed"), LONG, RequestMeta(tenant_id="t"), "doomed"
            )
            await anext(stream)
            first.kill()
            with pytest.raises(EngineDeadError, match="connection .* dropped"):
                await asyncio.wait_for(drain(stream), 60)
            assert not engine.is_alive  # how soon is docs/engine.md's figure, not an assert here
            with pytest.raises(EngineDeadError):
                engine.submit([1, 2], GREEDY, RequestMeta(tenant_id="t"), "while-down")
            second = await asyncio.to_thread(EngineProcess, tmp_path, *ENGINE_ARGS, port=first.port)
            later.append(second)
            await until(lambda: engine.is_alive, 10, "the gateway to rejoin the restarted engine")
            assert engine.engine_id == second.engine_id != first.engine_id
            outs = await collect(engine, "again", GREEDY, "after-restart")
            assert outs[-1].finished and len(outs[-1].token_ids) == GREEDY.max_tokens
            # An engine of another model on the same address is not served under this model's name.
            second.kill()
            await until(lambda: not engine.is_alive, 5, "the gateway to notice the second kill")
            other = tmp_path / "another-model"
            shutil.copytree(default_model_dir(str(tmp_path / "models")), other)
            later.append(
                await asyncio.to_thread(
                    EngineProcess, tmp_path, *ENGINE_ARGS, "--model", str(other), port=first.port
                )
            )
            await until(lambda: "another-model" in (engine._error or ""), 10, "the other model to be refused")
            assert not engine.is_alive and engine.engine_id == second.engine_id
            with pytest.raises(EngineDeadError, match="another-model"):
                engine.submit([1, 2], GREEDY, RequestMeta(tenant_id="t"), "wrong-model")
        finally:
            engine.shutdown()
            for proc in later:
                proc.kill()

    try:
        asyncio.run(scenario())
    finally:
        first.kill()


def test_a_frozen_engine_is_failed_over_and_then_told_to_drop_what_the_gateway_gave_up(
    tmp_path: Path,
) -> None:
    """SIGSTOP past the lost bound: the gateway fails the request; when the same engine answers again the
    gateway rejoins it and aborts that request there (the engine's own gateway timeout, 30 s, is not it)."""
    proc = EngineProcess(tmp_path, *ENGINE_ARGS, "--gateway-timeout", "30")

    async def scenario() -> None:
        engine = RemoteEngine(proc.address, SilenceBounds(HEARTBEAT_TIMEOUT_S, 1.5))
        engine.start()
        try:
            stream = engine.submit(
                engine.tokenizer.encode("frozen"), LONG, RequestMeta(tenant_id="frozen"), "frozen"
            )
            await anext(stream)
            os.kill(proc.proc.pid, signal.SIGSTOP)
            try:
                with pytest.raises(EngineDeadError, match="no word"):
                    async for _ in stream:
                        pass
            finally:
                os.kill(proc.proc.pid, signal.SIGCONT)
            await until(lambda: engine.is_alive, 10, "the gateway to rejoin the engine")
            assert engine.engine_id == proc.engine_id  # the same process: it still had the request

            # The announce the rejoin took says nothing about tenants (test_curve.py): wait for a report that
            # names the tenant and no longer runs its request.
            def ended() -> bool:
                stats = engine.stats()
                return "frozen" in stats.service and not stats.running_by_tenant.get("frozen")

            await until(ended, 60, "the request to end")
            # What the engine charged for it (w_out = 2 a token): run to the end it would be over 3000; the
            # abort the gateway sent on rejoining ended it within a few iterations of the thaw.
            assert engine.stats().service["frozen"] < LONG.max_tokens
        finally:
            engine.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        proc.kill()


def test_sigterm_drains_live_requests_then_exits(tmp_path: Path) -> None:
    proc = EngineProcess(tmp_path, *ENGINE_ARGS)

    async def refused(engine: RemoteEngine) -> bool:
        """A one-token probe: True once the engine refuses it as draining, False while it still serves."""
        try:
            await collect(engine, "probe", SamplingParams(max_tokens=1), f"probe-{uuid.uuid4().hex}")
        except EngineDeadError:
            return True
        return False

    async def scenario() -> list[RequestOutput]:
        # Generous bounds: the drain is under test here (its last frames must arrive), not the heartbeat,
        # which test_engine_killed_... covers; a loaded CI box can delay a heartbeat.
        engine = RemoteEngine(proc.address, SilenceBounds(5.0, 5.0))
        engine.start()
        try:
            params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
            stream = engine.submit(
                engine.tokenizer.encode("finish me"), params, RequestMeta(tenant_id="t"), "live"
            )
            outs = [await anext(stream)]
            proc.terminate()
            deadline = time.monotonic() + 10
            while not await refused(engine):  # a retryable refusal, not a hang
                assert time.monotonic() < deadline, "the draining engine kept admitting"
            outs += [o async for o in stream]
            return outs
        finally:
            engine.shutdown()

    try:
        outs = asyncio.run(scenario())
        assert outs[-1].finished and outs[-1].finish_reason == FinishReason.LENGTH
        assert proc.wait(30) == 0
    finally:
        proc.kill()
