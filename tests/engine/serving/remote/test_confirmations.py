"""A confirmation the engine never read is said again when the engine is back (engine/serving/remote/confirmations.py):
otherwise its record stays unconfirmed for good, its owner being a live gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.liveness import SilenceBounds
from tests.defaults import HEARTBEAT_TIMEOUT_S
from tests.engine.serving.remote.engine_process import EngineProcess
from tests.engine.serving.remote.test_remote_engine import ENGINE_ARGS, GREEDY, collect, until


def test_a_confirmation_sent_while_the_engine_was_down_reaches_its_restart(tmp_path: Path) -> None:
    first = EngineProcess(tmp_path, *ENGINE_ARGS)
    later: list[EngineProcess] = []

    async def scenario() -> None:
        engine = RemoteEngine(first.address, SilenceBounds(HEARTBEAT_TIMEOUT_S, 600))
        engine.start()
        try:
            outs = await collect(engine, "billed late", GREEDY, "a")
            completion = len(outs[-1].token_ids)
            first.kill()  # its record of "a" is in produced.log; the confirmation never went
            await until(lambda: not engine.is_alive, 10, "the gateway to notice the kill")
            assert not engine.billed(["a"], [completion])  # dropped: no connection
            second = await asyncio.to_thread(EngineProcess, tmp_path, *ENGINE_ARGS, port=first.port)
            later.append(second)
            await until(lambda: engine.is_alive, 10, "the gateway to rejoin the restarted engine")
            produced = await asyncio.wrap_future(engine.ask_produced(0.0))
            assert produced.unconfirmed == 0
        finally:
            engine.shutdown()

    try:
        asyncio.run(scenario())
    finally:
        first.kill()
        for proc in later:
            proc.kill()
