"""The engine actor: one `EngineServer` per actor, registered in the registry, restarted by Ray.

Ray gives the actor its resources (`num_gpus=1` on CUDA, `engine_cpus` otherwise; cluster/deploy.py) and
restarts its process when it dies (`max_restarts`); a restart runs `__init__` again, which binds a fresh
port, gets a fresh engine_id and registers again, so gateways swap the old incarnation for the new one.
The server's loop runs on a thread of its own; the actor's methods (pings, load, stop) run on Ray's.
"""

from __future__ import annotations

import logging
import os
import threading

import ray

from cluster.registry import REGISTRY_NAME, EngineEntry
from engine.config import EngineConfig
from engine.serving.remote.curve import ClusterKey
from engine.serving.remote.server import EngineServer
from gateway.engine_server_settings import EngineServerSettings

log = logging.getLogger("fairserve.cluster.engine")
# Engines re-register this often: a registry that Ray restarted (and so forgot them) learns them back.
REREGISTER_S = 5.0


class EngineActor:
    """Runs one engine server for the life of the actor's process."""

    def __init__(
        self, name: str, config: EngineConfig, host: str | None, key: ClusterKey | None = None
    ) -> None:
        self.name = name
        self.node_ip = ray.util.get_node_ip_address()
        knobs = EngineServerSettings.model_fields  # the tree's defaults for what `ray up` does not set
        self.server = EngineServer(
            config,
            f"tcp://{host or self.node_ip}:0",
            knobs["gateway_timeout_s"].default,
            knobs["grace_period_s"].default,
            cluster_key=key,
        )
        self.server.start()
        self._serving = threading.Thread(target=self._serve, name="engine-server", daemon=True)
        self._serving.start()
        self._stopped = threading.Event()
        self._registry = ray.get_actor(REGISTRY_NAME)
        self._handle = ray.get_runtime_context().current_actor
        ray.get(self._register())
        threading.Thread(target=self._reregister, name="engine-reregister", daemon=True).start()

    def _serve(self) -> None:
        """Serve until stopped. An engine whose loop died (a tensor-parallel rank of it, say) ends the
        actor's process, so Ray restarts the actor, and with it every rank, as one unit."""
        try:
            self.server.run()
        except BaseException:
            log.exception("engine %s died: exiting so Ray restarts this actor", self.name)
            logging.shutdown()
            os._exit(1)

    def _register(self) -> ray.ObjectRef[None]:
        entry = EngineEntry(self.name, self.server.address, self.server.engine_id, self.node_ip, os.getpid())
        return self._registry.register_engine.remote(entry, self._handle)

    def _reregister(self) -> None:
        while not self._stopped.wait(REREGISTER_S):
            try:
                ray.get(self._register(), timeout=REREGISTER_S)
            except Exception:  # the registry is restarting: the next round registers again
                continue

    def engine_id(self) -> str:
        """This incarnation's id (the registry's ping)."""
        return str(self.server.engine_id)

    def describe(self) -> dict[str, object]:
        """Address, id, node and process, for `ray status` and the tests."""
        return {
            "name": self.name,
            "address": self.server.address,
            "engine_id": self.server.engine_id,
            "node_ip": self.node_ip,
            "pid": os.getpid(),
            "serving": self._serving.is_alive(),
            # the group holding its ranks (cluster/placement.py): the same id after every restart
            "placement_group": ray.get_runtime_context().get_placement_group_id(),
        }

    def stop(self) -> None:
        """Stop serving (scale-down calls this after draining, before killing the actor)."""
        self._stopped.set()
        self.server.stop()
        self._serving.join(30)
