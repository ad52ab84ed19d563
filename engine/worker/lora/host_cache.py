"""Adapters in host memory: an LRU of `max_cpu_loras` loaded adapters, filled by loads on worker threads.

An adapter is named by its key, (name, PEFT directory). Reading a directory (json, safetensors, the
shape checks of engine/worker/lora/adapter.py) takes milliseconds to seconds, so it never runs on the engine
loop: `start` hands it to a small thread pool and `poll`, called at each step start, collects what has
finished. The cache is bounded in entries, counting the loads under way: a load starts only when there is
room or an entry nobody uses can be evicted (least recently used first); otherwise it waits for one, so a
flood of distinct adapters cannot grow host memory past the bound.

A failed load is remembered for `FAILURE_MEMORY_S`: a flood of requests for a broken directory is refused
from memory instead of reading it again each time, and a directory fixed in place is read again after.
An adapter that faulted inside a step (`fail(..., lasting=True)`: engine/worker/lora/intake.py `fault`), and any
failure of an adapter the gateway registered, is remembered until the adapter is registered again: each
failure keeps the registration it happened under (RequestMeta.lora_registered), and a request naming a
newer registration clears it, so the directory is read again.
"""

from __future__ import annotations

import queue
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor

from engine.worker.lora.adapter import AdapterError, LoraAdapter

Key = tuple[str, str]  # (adapter name, PEFT directory)
Loader = Callable[[str, str], LoraAdapter]  # (name, directory) -> the adapter on the host, or AdapterError

FAILURE_MEMORY_S = 30.0  # how long a failed directory is refused from memory before it is read again
LOAD_THREADS = 2  # concurrent directory reads: one slow directory does not hold every other load


class HostCache:
    """Loaded adapters by key (LRU), the loads under way, and recent failures."""

    def __init__(self, load: Loader, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.load = load  # replaceable before a load starts (tests hold a load open with it)
        self.capacity = capacity
        self._clock = clock
        self._entries: OrderedDict[Key, LoraAdapter] = OrderedDict()  # least recently used first
        self._loading: set[Key] = set()
        self._failed: dict[
            Key, tuple[str, float, str | None, bool]
        ] = {}  # key -> (error, when, registered, lasting)
        self._done: queue.SimpleQueue[tuple[Key, LoraAdapter | None, str]] = queue.SimpleQueue()
        self._pool: ThreadPoolExecutor | None = None  # started by the first load

    def get(self, key: Key) -> LoraAdapter | None:
        """The loaded adapter (now the most recently used), or None."""
        adapter = self._entries.get(key)
        if adapter is not None:
            self._entries.move_to_end(key)
        return adapter

    def failure(self, key: Key, registered: str | None = None) -> str | None:
        """The error `key` failed with, if that failure still holds for an adapter of registration
        `registered`: a load that failed within FAILURE_MEMORY_S, or a lasting one (a fault, or a registered
        adapter's failure) under the same registration. Else None (and the failure is forgotten)."""
        failed = self._failed.get(key)
        if failed is None:
            return None
        error, when, failed_under, lasting = failed
        if registered != failed_under:
            del self._failed[key]  # registered again: a new adapter
            return None
        if not lasting and self._clock() - when >= FAILURE_MEMORY_S:
            del self._failed[key]
            return None
        return error

    def loading(self, key: Key) -> bool:
        """Whether a load of `key` is under way."""
        return key in self._loading

    def put(self, key: Key, adapter: LoraAdapter) -> None:
        """Insert a loaded adapter (engine start loads its `--lora` entries on its own thread)."""
        self._entries[key] = adapter
        self._entries.move_to_end(key)

    def fail(self, key: Key, error: str, registered: str | None = None, lasting: bool = False) -> None:
        """Remember a failure of `key` under registration `registered` (lasting: until registered again;
        a registered adapter's failures always last)."""
        self._failed[key] = (error, self._clock(), registered, lasting or registered is not None)

    def drop(self, key: Key) -> None:
        """Forget `key`'s loaded adapter (it faulted): a later registration reads the directory again."""
        self._entries.pop(key, None)

    def start(self, key: Key, in_use: Callable[[], Collection[Key]]) -> bool:
        """Begin loading `key` on a worker thread, evicting the least recently used entry outside `in_use()`
        (asked only when the cache is full) if need be; False (nothing started) while every entry is in use
        or loading."""
        if key in self._loading:
            return True
        if len(self._entries) + len(self._loading) >= self.capacity:
            used = in_use()
            victim = next((k for k in self._entries if k not in used), None)
            if victim is None:
                return False
            del self._entries[victim]
        self._loading.add(key)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(LOAD_THREADS, thread_name_prefix="lora-load")
        future = self._pool.submit(self.load, *key)
        future.add_done_callback(lambda done: self._finished(key, done))
        return True

    def _finished(self, key: Key, future: Future[LoraAdapter]) -> None:
        """On the worker thread: hand the outcome to the loop's next `poll`."""
        try:
            self._done.put((key, future.result(), ""))
        except AdapterError as exc:
            self._done.put((key, None, str(exc)))
        except Exception as exc:  # a bug or an OS error in one load fails that adapter, not the engine
            self._done.put((key, None, f"adapter {key[0]!r}: loading failed: {type(exc).__name__}: {exc}"))

    def poll(self) -> list[tuple[Key, LoraAdapter | None, str]]:
        """Loads finished since the last call: (key, adapter, "") cached, or (key, None, error) remembered."""
        finished: list[tuple[Key, LoraAdapter | None, str]] = []
        while True:
            try:
                key, adapter, error = self._done.get_nowait()
            except queue.Empty:
                return finished
            self._loading.discard(key)
            if adapter is not None:
                self.put(key, adapter)
            else:
                self.fail(key, error)
            finished.append((key, adapter, error))

    @property
    def keys(self) -> list[Key]:
        """The cached keys, least recently used first."""
        return list(self._entries)

    def close(self) -> None:
        """Stop the load threads (a load under way finishes; its outcome is dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
