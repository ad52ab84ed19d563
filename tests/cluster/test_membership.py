"""A gateway's registry sync (cluster/membership.py) against a real `fairserve engine`, without Ray: an engine
the registry drops (a ping missed under load) and lists again comes back under the same router key with a
new client; the client it had keeps its live request until that ends, and is shut then, not kept open
(and pinging the engine) for the life of the gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cluster.membership import Membership, join, member_key
from cluster.registry import EngineEntry
from engine import RequestMeta, SamplingParams
from engine.serving.remote.liveness import SilenceBounds
from routing import EngineRouter
from tests.engine.serving.remote.engine_process import EngineProcess

ENGINE_ARGS = ("--num-kv-blocks", "512", "--max-num-batched-tokens", "64")
SILENCE = SilenceBounds(
    5.0, 5.0
)  # not what is tested here: generous, so a loaded machine does not fail the request


def test_an_engine_dropped_and_listed_again_leaves_no_client_open(tmp_path: Path) -> None:
    engine = EngineProcess(tmp_path / "engine", *ENGINE_ARGS)
    try:
        entry = EngineEntry("fairserve-engine-0", engine.address, engine.engine_id, "127.0.0.1", 0)
        asyncio.run(_dropped_and_listed_again(entry))
    finally:
        engine.stop()


async def _dropped_and_listed_again(entry: EngineEntry) -> None:
    listed = [entry]

    async def read_registry() -> list[EngineEntry]:
        return list(listed)

    first = await asyncio.to_thread(join, entry, SILENCE)
    first.bind(asyncio.get_running_loop())
    router = EngineRouter({member_key(entry): first})
    sync = Membership(router, read_registry, 0.5, SILENCE)
    try:
        params = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)
        held = router.submit(list(range(10, 20)), params, RequestMeta(tenant_id="t"), "held")
        listed.clear()
        await sync.sync_once()  # dropped: out of the rotation, its request still live there
        assert router.keys() == [] and first.is_alive
        listed.append(entry)
        await sync.sync_once()  # listed again: the same key, a new client
        assert router.keys() == [member_key(entry)]
        assert [c is first for c in router.clients()] == [False, True]
        assert first.is_alive, "the old client was shut with a request still live on it"
        held.close()  # the request ends (aborted here): nothing is left on the old client
        await sync.sync_once()
        assert not first.is_alive, "the old client is still open after its last request ended"
        assert len(router.clients()) == 1 and router.clients()[0].is_alive
    finally:
        router.shutdown(timeout_s=1.0)
        first.shutdown(timeout_s=1.0)
