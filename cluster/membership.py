"""Keep a gateway's router in step with the registry: engines join, leave, drain and come back restarted.

Runs as a task on the gateway's event loop (the loop its RemoteEngines read on), re-reading the registry
every `poll_interval_s`. The router key of an engine is `name@engine_id`, so a restarted actor (same name,
new process) is a new member and its dead predecessor leaves. A member that leaves the rotation keeps its
live requests (routing.EngineRouter.remove_engine); its client is shut only once they have ended, which is
how scale-down drains without cutting anyone off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from cluster.registry import EngineEntry
from engine.serving.boundary.client import EngineClient
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.curve import ClusterKey
from engine.serving.remote.liveness import SilenceBounds
from routing.router import EngineRouter

log = logging.getLogger("fairserve.cluster")
# A registered engine that does not answer its first hello within this long is tried again next round.
JOIN_TIMEOUT_S = 10.0


def member_key(entry: EngineEntry) -> str:
    """The router key of one engine incarnation."""
    return f"{entry.name}@{entry.engine_id}"


def actor_of(key: str) -> str:
    """The actor name in a router key."""
    return key.partition("@")[0]


def join(entry: EngineEntry, silence: SilenceBounds, key: ClusterKey | None = None) -> RemoteEngine:
    """A started front for a registered engine (blocking: call on a thread, then bind it to the loop)."""
    client = RemoteEngine(entry.address, silence, cluster_key=key)
    client.start_timeout_s = JOIN_TIMEOUT_S
    try:
        client.start()
    except Exception:
        client.shutdown(timeout_s=1.0)
        raise
    return client


class Membership:
    """The registry-to-router sync of one gateway."""

    def __init__(
        self,
        router: EngineRouter,
        read_registry: Callable[[], Any],
        poll_interval_s: float,
        silence: SilenceBounds,
        cluster_key: ClusterKey | None = None,
    ) -> None:
        self.router = router
        self.cluster_key = cluster_key
        self.read_registry = read_registry  # returns an awaitable list[EngineEntry] (a Ray ObjectRef)
        self.poll_interval_s = poll_interval_s
        self.silence = silence
        self._leaving: list[EngineClient] = []  # out of the rotation, shut once their requests have ended
        self.rounds = 0  # completed syncs, for callers that wait for one to have happened

    async def run(self) -> None:
        """Sync forever (cancel to stop); a failed round is logged and retried next period."""
        while True:
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("registry sync failed; retrying", exc_info=True)
            await asyncio.sleep(self.poll_interval_s)  # the poll period, not a synchronisation

    async def sync_once(self) -> None:
        """One round: take out what left or drains, let in what joined, release drained clients."""
        entries: list[EngineEntry] = await self.read_registry()
        wanted = {member_key(e): e for e in entries if not e.draining}
        current = set(self.router.keys())
        for key in current - wanted.keys():
            client = self.router.remove_engine(key)
            if client is not None:
                self._leaving.append(client)
        joining = [e for key, e in wanted.items() if key not in current]
        if joining:
            await asyncio.gather(*(self._add(e) for e in joining))
        self._release_drained()
        self.rounds += 1

    async def _add(self, entry: EngineEntry) -> None:
        try:
            client = await asyncio.to_thread(join, entry, self.silence, self.cluster_key)
        except Exception as exc:  # it died or is not up yet: the registry drops or keeps it, we retry
            log.warning("engine %s at %s did not answer: %s", entry.name, entry.address, exc)
            return
        client.bind(asyncio.get_running_loop())
        try:
            self.router.add_engine(member_key(entry), client)
        except ValueError:
            log.exception("engine %s refused", entry.name)
            client.shutdown(timeout_s=1.0)

    def _release_drained(self) -> None:
        """Shut the clients of removed engines once this gateway has no request left on them (the router
        lets a leaving engine go with its last request). By client, not by key: an engine the registry
        dropped for a missed ping comes back under the same key with a new client, and the old one must
        still be shut once its requests end."""
        held = self.router.clients()
        done = [c for c in self._leaving if not any(c is h for h in held)]
        self._leaving = [c for c in self._leaving if any(c is h for h in held)]
        for client in done:
            with contextlib.suppress(Exception):
                client.shutdown(timeout_s=1.0)

    def holds(self, actor_name: str) -> bool:
        """Whether this gateway still routes to, or has requests live on, an engine of `actor_name`."""
        return any(actor_of(load.key) == actor_name for load in self.router.engine_loads())
