"""`fairserve engine --role prefill|decode`: an engine server that runs one part of each request.

`RoleServer` is the EngineServer with the hand-off loop (engine/serving/disagg.py) and one KV thread
(engine/serving/remote/kv_transfer.py): a prefill engine serves held blocks on a KV port of its own (on the host
of `--listen`, a free port) and names it in its announce; a decode engine pulls from the address each
Submit names. `RoleAwareEngine` is the gateway's RemoteEngine that remembers the role and KV address an
engine announced, so the gateway can put prefill and decode engines in their pools (routing/roles.py).

A prefill engine schedules synchronously (`async_scheduling` off): with a step in flight it would already
have scheduled a request's second token when its first one is handed off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import msgspec

from engine.config import EngineConfig
from engine.serving.boundary.worker import EngineLoop
from engine.serving.disagg import HandoffLoop, KVArrived, ReleaseHeld
from engine.serving.llm_engine import LLMEngine
from engine.serving.remote.client import RemoteEngine
from engine.serving.remote.curve import ClusterKey
from engine.serving.remote.kv_transfer import KVPuller, KVServer
from engine.serving.remote.messages import Announce
from engine.serving.remote.server import EngineServer, GatewayInbox

Role = Literal["both", "prefill", "decode"]


class RoleServer(EngineServer):
    """An EngineServer for `--role prefill` or `--role decode` (module docstring)."""

    def __init__(
        self,
        config: EngineConfig,
        listen: str,
        gateway_timeout_s: float,
        grace_period_s: float,
        role: Role,
        kv_hold_timeout_s: float,
        kv_pull_timeout_s: float,
        cluster_key: ClusterKey | None = None,
        produced_path: Path | None = None,
    ) -> None:
        if role == "prefill":
            config = config.model_copy(update={"async_scheduling": "off"})
        super().__init__(config, listen, gateway_timeout_s, grace_period_s, cluster_key, produced_path)
        self.role = role
        self._hold_timeout_s = kv_hold_timeout_s
        self._pull_timeout_s = kv_pull_timeout_s
        self.kv_server: KVServer | None = None
        self.kv_puller: KVPuller | None = None
        self.loop: HandoffLoop | None = None

    def start(self) -> None:
        """Build the engine and bind (EngineServer.start), then start the KV thread of this role."""
        super().start()
        engine = self._engine
        assert engine is not None
        if engine.peers is not None:
            raise ValueError(
                "--role prefill/decode does not run with tensor_parallel_size > 1: the KV hand-off "
                "would carry rank 0's shard of the heads only"
            )
        if engine.runner.windows is not None:
            raise ValueError(
                "--role prefill/decode needs the sliding-window layers' KV in the block pool: "
                "keep enable_prefix_caching on"
            )
        if self.role == "prefill":
            host = self.address.removeprefix("tcp://").rpartition(":")[0]
            self.kv_server = KVServer(
                host, engine.runner.read_blocks, self._released, self._hold_timeout_s, self.cluster_key
            )
        elif self.role == "decode":
            self.kv_puller = KVPuller(self._arrived, self._pull_timeout_s, self.cluster_key)

    def run(self) -> None:
        """Serve (EngineServer.run), then stop the KV thread."""
        try:
            super().run()
        finally:
            for kv in (self.kv_server, self.kv_puller):
                if kv is not None:
                    kv.close()

    def _drained(self) -> bool:
        """A draining prefill engine also waits for the KV it holds to be pulled (or to expire)."""
        return super()._drained() and (self.loop is None or not self.loop.held)

    def _make_loop(self, engine: LLMEngine, inbox: GatewayInbox) -> EngineLoop:
        self.loop = HandoffLoop(engine, inbox, self._publish, self.kv_server, self.kv_puller)
        return self.loop

    def _announce(self, want_tokenizer: bool) -> Announce:
        kv_address = self.kv_server.address if self.kv_server is not None else ""
        return msgspec.structs.replace(
            super()._announce(want_tokenizer), role=self.role, kv_address=kv_address
        )

    # -- from the KV threads to the loop (its inbox is the socket thread's queue) ----------------
    def _released(self, request_id: str) -> None:
        self._items.put((b"", ReleaseHeld(request_id)))

    def _arrived(self, arrived: KVArrived) -> None:
        self._items.put((b"", arrived))


class RoleAwareEngine(RemoteEngine):
    """A RemoteEngine that keeps the role and KV address its engine announced."""

    role: str = "both"
    kv_address: str = ""

    def _adopt(self, ann: Announce) -> None:
        super()._adopt(ann)
        if self._alive and self._engine_id == ann.engine_id:
            self.role, self.kv_address = ann.role, reachable(ann.kv_address, self.address)


def reachable(kv_address: str, engine_address: str) -> str:
    """The KV address a decode engine can dial: an engine bound to a wildcard host (`--listen
    tcp://0.0.0.0:5555`) announces that host, so the host the gateway reached the engine on stands in."""
    host, sep, port = kv_address.removeprefix("tcp://").rpartition(":")
    if not sep or host.strip("[]") not in ("0.0.0.0", "*", "::", ""):
        return kv_address
    return f"tcp://{engine_address.removeprefix('tcp://').rpartition(':')[0]}:{port}"
