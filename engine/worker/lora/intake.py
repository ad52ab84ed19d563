"""LoraIntake: the wait of an adapted request for its adapter's load (a `Wait`, engine/core/waits.py), and how
the adapter reaches a device slot and its load is charged.

A request names its adapter by `RequestMeta.lora` and, when the gateway's adapter directory registered it
at run time, `RequestMeta.lora_path`; without a path the name is looked up in the engine's `--lora` table.
The pair is the adapter's key (engine/worker/lora/host_cache.py). If the key is in host memory the request is
queued at once. If not, its load starts on a worker thread and the scheduler holds the request in state
`WAITING_FOR_ADAPTER`: live, but with no batch seat, no KV block and no place in the fairness order, until
`admit` (polled by the scheduler at every step start) finds the load done. A failed load refuses exactly the requests parked on
that key (InvalidRequestError, field `model`, which the gateway turns into a 400), and for a while every
new request naming it (the host cache remembers the failure).

Device slots (engine/worker/lora/cache.py): the scheduler asks `admissible` before admitting an adapted request;
the adapter takes a slot then, evicting the least recently used adapter that no running request uses and
no step still in flight reads (`note_in_flight`). With every slot pinned the request stays queued this
step (admission stops, as it does when KV blocks run out).

Loads are taken in turn across tenants: a tenant has at most LOADS_PER_TENANT under way, its other new
adapters wait (parked) until one lands, so a tenant that names many new adapters cannot hold every load
thread while another tenant's single adapter waits.

Host entries used by a live request are never evicted: each live request's key is held until the engine
forgets it (`forget`), so a queued request always finds its weights when it is admitted.

Service: a load is charged to the request that caused it, once, as prefill tokens: one per
`bytes_per_token` bytes of adapter_model.safetensors read, rounded up (docs/fairness.md, "LoRA adapters:
the charge"). A later request that finds the adapter cached pays nothing for it. Then each of its tokens
is charged the adapter's rank-aware factor (engine/worker/lora/cost.py), set on the request here.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial

import torch

from engine.config import EngineConfig
from engine.core.errors import InvalidRequestError, RequestFault
from engine.core.request import Request, RequestMeta, RequestState
from engine.core.scheduler_output import ScheduledChunk
from engine.worker.lora.adapter import AdapterError, LoraAdapter, load_adapter
from engine.worker.lora.cache import DeviceSlots
from engine.worker.lora.cost import service_scale
from engine.worker.lora.host_cache import HostCache, Key, Loader
from engine.worker.lora.resident import ResidentStack
from engine.worker.model_config import ModelConfig
from fairness.base import SchedulingPolicy

log = logging.getLogger(__name__)

# Loads one tenant may have under way at once: a tenant naming many new adapters queues its own loads
# behind each other instead of filling every load thread (engine/worker/lora/host_cache.py) ahead of others.
LOADS_PER_TENANT = 1


class LoraIntake:
    """The scheduler's wait for adapters (their parked requests and loads), the host cache and the device
    slots."""

    state = RequestState.WAITING_FOR_ADAPTER

    def __init__(
        self,
        policy: SchedulingPolicy[Request],
        startup: Mapping[str, str],
        host: HostCache,
        stack: ResidentStack,
        max_loras: int,
        bytes_per_token: int,
    ) -> None:
        self.policy = policy  # charged each load, by the request that caused it
        self.startup = dict(startup)  # `--lora` name -> directory: a request without lora_path uses these
        self.host = host
        self.stack = stack  # the slots' weights on the device, filled through the slots' hooks
        self.slots = DeviceSlots(max_loras, on_put=stack.put, on_drop=stack.drop)
        self.bytes_per_token = bytes_per_token
        self.refuse_all: str | None = None  # set: every adapted request is refused with it (e.g. TP > 1)
        self.loaded_any = False  # some adapter has loaded: requests may carry a service_scale
        self._parked: dict[str, tuple[Request, list[Request], Key]] = {}  # id -> (request, members, key)
        self._by_key: dict[Key, list[str]] = {}  # key -> its parked requests, keys in order of first arrival
        self._payers: dict[Key, Request] = {}  # key -> the request whose arrival started its load
        self._loads: Counter[str] = Counter()  # tenant -> its loads under way
        self._holders: dict[str, Key] = {}  # live request (or choice) id -> the adapter it runs under
        self._refused: list[tuple[Request, InvalidRequestError]] = []
        self._faulted: list[tuple[Request, RequestFault]] = []  # queued or running: ended by the engine
        self._in_flight: set[Key] = set()  # adapters of the step whose forward still runs (async scheduling)

    def preload(self, load: Loader) -> None:
        """Load the `--lora` entries now, on the caller's thread (engine start), as far as the host cache
        holds them; a broken one is logged and remembered, not raised."""
        for name, path in list(self.startup.items())[: self.host.capacity]:
            try:
                self.host.put((name, path), load(name, path))
                self.loaded_any = True
            except AdapterError as exc:
                log.error("LoRA %s", exc)
                self.host.fail((name, path), str(exc))

    @property
    def failed(self) -> dict[str, str]:
        """`--lora` names whose directory failed to load recently, with the error."""
        errors = {name: self.host.failure((name, path)) for name, path in self.startup.items()}
        return {name: error for name, error in errors.items() if error is not None}

    def key(self, meta: RequestMeta) -> Key:
        """The adapter a request names; InvalidRequestError (field `model`) if it names none this engine
        can serve."""
        name = meta.lora
        assert name is not None
        if self.refuse_all is not None:
            raise InvalidRequestError(self.refuse_all, "model")
        path = meta.lora_path if meta.lora_path is not None else self.startup.get(name)
        if path is None:
            raise InvalidRequestError(f"unknown LoRA adapter {name!r}", "model")
        return name, path

    def hold(self, request: Request, members: Sequence[Request]) -> bool:
        """True when `request` must wait for its adapter to load; False when it may be queued now (its
        adapter is cached, or it names none). Raises InvalidRequestError if the adapter recently failed.
        `members`: the requests that run under it (the choices of n > 1, else the request itself)."""
        if request.meta.lora is None:
            return False
        key = self.key(request.meta)
        error = self.host.failure(key, request.meta.lora_registered)
        if error is not None:
            raise InvalidRequestError(error, "model")
        adapter = self.host.get(key)
        if adapter is not None:
            self._attach(members, key, adapter)
            return False
        self._parked[request.request_id] = (request, list(members), key)
        self._by_key.setdefault(key, []).append(request.request_id)
        self._start(key, request)
        return True

    def _start(self, key: Key, request: Request) -> None:
        """Start loading `key` for `request` unless it is loading, its tenant has a load under way already
        (LOADS_PER_TENANT), or the host cache has no room; `admit` tries again at each step."""
        if self.host.loading(key):
            return
        tenant = request.meta.tenant_id
        if self._loads[tenant] >= LOADS_PER_TENANT:
            return
        if self.host.start(key, self.in_use):
            self._payers[key] = request
            self._loads[tenant] += 1

    @property
    def waiting(self) -> int:
        """Requests waiting for their adapter."""
        return len(self._parked)

    def admit(self) -> list[Request]:
        """The parked requests whose adapter has loaded, to be queued now; refuses those whose load failed,
        charges each finished load to its payer, and starts the loads that waited (for room or their turn).
        Its work grows with the loads that landed and the keys still waiting, not with parked requests."""
        if not self._by_key and not self._payers:
            return []
        admitted = []
        for key, adapter, error in self.host.poll():
            payer = self._payers.pop(key, None)
            if payer is not None:
                self._loads[payer.meta.tenant_id] -= 1
            if adapter is None:
                log.error("LoRA %s", error)
                waiting = self._by_key.get(key)
                first = payer or (self._parked[waiting[0]][0] if waiting else None)
                if first is not None:  # remembered under the registration it failed with
                    self.host.fail(key, error, first.meta.lora_registered)
                self._refuse(key, error)
                continue
            self.loaded_any = True
            if payer is not None:
                self._charge_load(payer, adapter)
            for request_id in self._by_key.pop(key, []):
                request, members, _ = self._parked.pop(request_id)
                self._attach(members, key, adapter)
                admitted.append(request)
        for key, waiting in self._by_key.items():
            if not self.host.loading(key):
                self._start(key, self._parked[waiting[0]][0])
        return admitted

    def _charge_load(self, payer: Request, adapter: LoraAdapter) -> None:
        """Charge the load to the tenant whose request started it, as ceil(bytes / rate) prefill tokens (at
        the base factor: the payer's own service_scale is set only once it is released)."""
        tokens = max(1, -(-adapter.load_bytes // self.bytes_per_token))
        payer.charged_service += self.policy.charge(payer, tokens, 0, 0)

    def _refuse(self, key: Key, error: str) -> None:
        for request_id in self._by_key.pop(key, []):
            request, _, _ = self._parked.pop(request_id)
            self._refused.append((request, InvalidRequestError(error, "model")))

    def _attach(self, members: Sequence[Request], key: Key, adapter: LoraAdapter) -> None:
        for member in members:
            member.service_scale = adapter.service_scale
            self._holders[member.request_id] = key

    def in_use(self) -> set[Key]:
        """Host entries a live request holds (never evicted)."""
        return set(self._holders.values())

    def admissible(self, running: Sequence[Request], request: Request) -> bool:
        """Whether `request` may be admitted now: no adapter, or its adapter holds a device slot (taken now
        if need be, evicting the least recently used adapter that no `running` request and no step in
        flight uses: a forward still running reads its slots)."""
        key = self._holders.get(request.request_id)
        if key is None:
            return True
        error = self.host.failure(key, request.meta.lora_registered)
        if error is not None:  # it faulted since this request was queued
            self._faulted.append((request, RequestFault(error, "model")))
            return False
        pinned: set[Key] = set()
        if self.slots.slot(key) is None:
            pinned = {held for r in running if (held := self._holders.get(r.request_id)) is not None}
            pinned |= self._in_flight
        try:
            return self.slots.acquire(key, self._weights(key), pinned) is not None
        except (
            Exception
        ) as exc:  # its copy into the device slot failed (engine/worker/lora/cache.py undid it)
            self.fault(key, request, f"adapter {key[0]!r} failed in its device slot: {exc}")
            return False

    def fault(self, key: Key, request: Request, error: str) -> None:
        """`key`'s adapter faulted on `request` inside a step: the request fails alone (a 400 naming
        `model`, taken by `take_faulted`), and the adapter is refused at once from now on until it is
        registered again (engine/worker/lora/host_cache.py)."""
        self.blame(key, request, error)
        self._faulted.append((request, RequestFault(error, "model")))

    def blame(self, key: Key, request: Request, error: str) -> None:
        """Refuse `key`'s adapter from now on until it is registered again; `request` found it faulty."""
        log.error("LoRA %s", error)
        self.host.fail(key, error, request.meta.lora_registered, lasting=True)
        self.host.drop(key)

    def blame_adapter_of(self, request: Request, error: str) -> None:
        """`blame` the adapter of a request whose own rows went wrong in the forward (engine/worker/model_runner.py,
        which fails the request): its adapter is the only part of those rows that is its own."""
        key = self._holders.get(request.request_id)
        if key is not None:
            self.blame(key, request, error)

    def take_faulted(self) -> list[tuple[Request, RequestFault]]:
        """Requests whose adapter faulted since the last call: the engine ends each alone."""
        faulted, self._faulted = self._faulted, []
        return faulted

    def note_in_flight(self, chunks: Sequence[ScheduledChunk]) -> None:
        """The step whose forward is still running after `execute` returned (none without async scheduling):
        its adapters stay in their slots until it lands, even if their requests end or are preempted."""
        if self._in_flight or (chunks and self.slots.in_use):
            keys = (self._holders.get(c.request.request_id) for c in chunks)
            self._in_flight = {key for key in keys if key is not None}

    def _weights(self, key: Key) -> LoraAdapter:
        adapter = self.host.get(key)
        assert adapter is not None, "a held adapter stays in the host cache"
        return adapter

    def slot(self, request: Request) -> int | None:
        """The device slot of the adapter `request` runs under (None: the base model)."""
        key = self._holders.get(request.request_id)
        return None if key is None else self.slots.slot(key)

    def release(self, request_id: str) -> Request | None:
        """Take a parked request out (it was aborted), or None if it is not parked."""
        parked = self._parked.pop(request_id, None)
        if parked is None:
            return None
        waiting = self._by_key[parked[2]]
        waiting.remove(request_id)
        if not waiting:
            del self._by_key[parked[2]]
        return parked[0]

    def take_refused(self) -> list[tuple[Request, InvalidRequestError]]:
        """Requests refused since the last call, mostly because their adapter failed to load."""
        refused, self._refused = self._refused, []
        return refused

    def forget(self, request_id: str) -> None:
        """A request (or choice) ended: its hold on the adapter goes."""
        self._holders.pop(request_id, None)

    def close(self) -> None:
        """Stop the load threads."""
        self.host.close()


def load_to_host(cfg: ModelConfig, max_rank: int, dtype: torch.dtype, name: str, path: str) -> LoraAdapter:
    """One adapter read into host memory in the model's dtype, with its service factor (a load thread's
    work; AdapterError naming it if the directory is broken)."""
    adapter = load_adapter(name, path, cfg, max_rank, dtype, torch.device("cpu"))
    adapter.service_scale = service_scale(cfg, adapter)
    return adapter


def build_intake(
    config: EngineConfig,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    policy: SchedulingPolicy[Request],
) -> LoraIntake:
    """The engine's intake: `--lora` entries loaded now, others on demand; refuses every adapter under
    tensor parallelism (not served there yet)."""
    load = partial(load_to_host, cfg, config.max_lora_rank, dtype)
    host = HostCache(load, config.max_cpu_loras)
    stack = ResidentStack(cfg, config.max_loras, dtype, device)
    intake = LoraIntake(policy, config.lora, host, stack, config.max_loras, config.lora_load_bytes_per_token)
    if config.tensor_parallel_size > 1:
        intake.refuse_all = "LoRA adapters are not served with tensor_parallel_size > 1 yet"
    intake.preload(load)
    return intake
