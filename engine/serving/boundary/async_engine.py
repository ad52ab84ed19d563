"""`AsyncEngine`: the engine loop on a thread of this process, behind the same message boundary as a worker.

Only messages (engine/serving/boundary/messages.py) cross the boundary, so `ProcessEngine` can run the very same
`EngineLoop` in its own process without the gateway changing.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from engine.config import EngineConfig
from engine.serving.boundary.front import EngineFront
from engine.serving.boundary.messages import EngineDeadError, StopLoop
from engine.serving.boundary.worker import EngineLoop
from engine.serving.llm_engine import LLMEngine

log = logging.getLogger("fairserve.engine")

__all__ = ["AsyncEngine", "EngineDeadError"]


class AsyncEngine(EngineFront):
    """Asyncio front of an LLMEngine whose loop runs on a dedicated thread."""

    def __init__(self, config: EngineConfig, engine: LLMEngine | None = None) -> None:
        super().__init__()
        self.engine = engine or LLMEngine(config)
        self.config = config
        self.tokenizer = self.engine.tokenizer
        self.model_name = self.engine.model_name
        self.max_model_len = self.engine.max_model_len
        self._limits = self.engine.limits
        self._stats = self.engine.stats()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the loop thread."""
        if self._thread is not None:
            return
        self._alive = True
        self._thread = threading.Thread(target=self._run, name="fairserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; in-flight requests end as cancelled (reason "shutdown")."""
        if self._thread is None:
            return
        self._inbox.put(StopLoop())
        self._thread.join(timeout_s)
        self._thread = None

    def _send(self, msg: Any) -> None:
        if not self._alive:
            raise EngineDeadError(self._error or "engine loop is not running")
        self._inbox.put(msg)

    def _run(self) -> None:
        try:
            EngineLoop(self.engine, self._inbox, self._dispatch).run()
        except BaseException as exc:  # the loop must never die silently
            log.exception("engine loop died")
            self._error = f"engine loop died: {exc!r}"
            self._fail_all(EngineDeadError(self._error))
            return
        self._fail_all(EngineDeadError("engine shut down"))
