"""The adapter caches: device slots (LRU, in-flight adapters pinned, put/drop hooks) and host memory (LRU,
bounded with loads counted), over a real engine and real adapter directories."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, LLMEngine, SamplingParams
from engine.core.request import RequestMeta
from engine.worker.lora.adapter import LoraAdapter
from engine.worker.lora.cache import DeviceSlots
from engine.worker.lora.host_cache import Key
from engine.worker.lora.intake import load_to_host
from engine.worker.lora.resident import ResidentStack, stack_bytes
from engine.worker.lora.stack import LoraStack
from tests.engine.worker.lora.adapters import Adapted, build
from tests.engine.worker.lora.runtime import gate, held_for_adapter, run_checked

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
NAMES = ("a", "b", "c")


@pytest.fixture(scope="module")
def adapted(tmp_path_factory: pytest.TempPathFactory) -> Adapted:
    specs = {
        "a": (4, ["q_proj", "v_proj"], False),
        "b": (8, ["o_proj", "down_proj"], False),
        "c": (2, ["k_proj", "gate_proj"], True),
    }
    return build(tmp_path_factory.mktemp("llama"), "llama", specs)


def key(adapted: Adapted, name: str) -> Key:
    return name, str(adapted.adapters[name])


def meta(adapted: Adapted, name: str | None) -> RequestMeta:
    return RequestMeta() if name is None else RequestMeta(lora=name, lora_path=str(adapted.adapters[name]))


def engine(adapted: Adapted, **config: object) -> LLMEngine:
    return LLM(str(adapted.base), dtype="float32", **config).engine


def generate(
    llm_engine: LLMEngine, adapted: Adapted, names: list[str | None], first: int = 0
) -> list[list[int]]:
    """Every request added at once, prompt `first + i` for the i-th, run to the end with the pinning
    invariant checked at each step (tests/engine/worker/lora/runtime.py)."""
    for i, name in enumerate(names, start=first):
        llm_engine.add_request(f"r{i}", list(range(10 + i, 30 + i)), PARAMS, meta(adapted, name))
    out = run_checked(llm_engine)
    assert not out.refused
    return [out.tokens[f"r{i}"] for i in range(first, first + len(names))]


def test_device_slots_evict_the_least_recently_used_unpinned_adapter(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    cfg, dtype = llm_engine.loaded.config, llm_engine.loaded.dtype
    host = {name: load_to_host(cfg, 64, dtype, *key(adapted, name)) for name in NAMES}
    events: list[tuple[str, int]] = []

    def put(slot: int, adapter: LoraAdapter) -> None:
        events.append((f"put {adapter.name}", slot))

    slots = DeviceSlots(2, on_put=put, on_drop=lambda slot: events.append(("drop", slot)))
    a, b, c = (key(adapted, name) for name in NAMES)
    assert slots.acquire(a, host["a"], ()) == 0 and slots.acquire(b, host["b"], ()) == 1
    assert slots.acquire(a, host["a"], ()) == 0  # a is now the most recently used
    assert slots.acquire(c, host["c"], ()) == 1  # b, the least recently used, goes
    assert slots.keys == [a, c] and slots.slot(b) is None
    assert slots.acquire(b, host["b"], pinned={c}) == 0  # a is older, but c is pinned: a goes
    assert slots.acquire(a, host["a"], pinned={b, c}) is None  # every slot pinned: nothing moves
    assert slots.keys == [c, b] and slots.evictions == 2
    assert events == [("put a", 0), ("put b", 1), ("drop", 1), ("put c", 1), ("drop", 0), ("put b", 0)]


@pytest.mark.parametrize("cpu_loras", [1, 2])
@pytest.mark.parametrize("async_scheduling", ["off", "on"])
def test_one_slot_two_adapters_both_finish_as_they_would_alone(
    adapted: Adapted, cpu_loras: int, async_scheduling: str
) -> None:
    names: list[str | None] = ["a", "b", None, "a", "b", "a"]
    config = {"max_loras": 1, "max_cpu_loras": cpu_loras, "async_scheduling": async_scheduling}
    llm_engine = engine(adapted, **config)
    together = generate(llm_engine, adapted, names)
    solo = engine(adapted)  # default caches, one request at a time
    alone = [generate(solo, adapted, [name], first=i)[0] for i, name in enumerate(names)]
    assert together == alone
    assert together[0] != together[1]  # the two adapters differ: the comparison can fail
    assert llm_engine.lora.slots.evictions >= 1  # the single slot changed hands


def test_an_adapter_in_flight_keeps_its_slot_and_the_other_waits_queued(adapted: Adapted) -> None:
    llm_engine = engine(adapted, max_loras=1)
    long = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm_engine.add_request("first", list(range(5, 25)), long, meta(adapted, "a"))
    while "first" not in {r.request_id for r in llm_engine.scheduler.running}:
        llm_engine.step()
    llm_engine.add_request("second", list(range(5, 25)), PARAMS, meta(adapted, "b"))
    waited = 0
    while "first" in llm_engine.scheduler.requests:
        llm_engine.step()
        if "first" in llm_engine.scheduler.requests:
            assert llm_engine.lora.slots.keys == [key(adapted, "a")]  # pinned while it runs
            second = llm_engine.scheduler.requests.get("second")
            if second is not None:  # loaded and queued: waiting for the slot, holding no seat or block
                assert second not in llm_engine.scheduler.running
                assert not llm_engine.pool.block_ids("second")
                waited += 1
    assert waited > 0
    out = run_checked(llm_engine)
    assert len(out.tokens["second"]) == 6 and llm_engine.lora.slots.keys == [key(adapted, "b")]


@pytest.mark.parametrize("scheduling", ["off", "on"])
def test_a_head_without_a_slot_does_not_hold_up_the_requests_behind_it(
    adapted: Adapted, scheduling: str
) -> None:
    """One slot, held by a running request of adapter a; a request of adapter b, then one of the base model,
    queue behind it. b's request is set aside each step (no slot frees while a's runs), so the base request
    is admitted and finishes while a's still runs; b's runs once a's ends, and gives what it gives alone."""
    llm_engine = engine(adapted, max_loras=1, async_scheduling=scheduling)
    long = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    llm_engine.add_request("first", list(range(5, 25)), long, meta(adapted, "a"))
    while "first" not in {r.request_id for r in llm_engine.scheduler.running}:
        llm_engine.step()
    llm_engine.add_request("second", list(range(11, 31)), PARAMS, meta(adapted, "b"))
    while held_for_adapter(llm_engine):  # its adapter loads off the loop first
        llm_engine.step()
    llm_engine.add_request("third", list(range(7, 27)), PARAMS, meta(adapted, None))
    ended: list[str] = []
    tokens: dict[str, list[int]] = {}
    while llm_engine.has_unfinished():
        for delta in llm_engine.step_deltas():
            tokens.setdefault(delta.request_id, []).extend(delta.new_token_ids)
            if delta.finish_reason is not None:
                ended.append(delta.request_id)
    assert ended.index("third") < ended.index("first") < ended.index("second")
    assert [tokens["second"]] == generate(engine(adapted), adapted, ["b"], first=1)


def test_host_memory_keeps_the_most_recently_used_adapters(adapted: Adapted) -> None:
    llm_engine = engine(adapted, max_loras=1, max_cpu_loras=2)
    a, b, c = (key(adapted, name) for name in NAMES)
    for name in ("a", "b"):
        generate(llm_engine, adapted, [name])
    assert llm_engine.lora.host.keys == [a, b]
    generate(llm_engine, adapted, ["a"])  # a cache hit makes a the most recently used
    assert llm_engine.lora.host.keys == [b, a]
    generate(llm_engine, adapted, ["c"])  # full: b, the least recently used, goes
    assert llm_engine.lora.host.keys == [a, c]


def test_an_adapter_stays_in_its_slot_while_a_forward_using_it_is_in_flight(adapted: Adapted) -> None:
    llm_engine = engine(adapted, max_loras=1, async_scheduling="on")
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    llm_engine.add_request("first", list(range(5, 25)), long, meta(adapted, "a"))
    llm_engine.add_request("second", list(range(5, 25)), PARAMS, meta(adapted, "b"))
    while held_for_adapter(llm_engine):  # b loaded and queued behind a's slot
        llm_engine.step()
    assert llm_engine.executor.in_flight and llm_engine.lora.slots.keys == [key(adapted, "a")]
    llm_engine.abort_request("first")
    llm_engine.step()  # first leaves `running`, but the forward in flight still reads a's slot
    assert llm_engine.lora.slots.keys == [key(adapted, "a")]
    assert "second" not in {r.request_id for r in llm_engine.scheduler.running}
    out = run_checked(llm_engine)
    assert len(out.tokens["second"]) == 6 and llm_engine.lora.slots.keys == [key(adapted, "b")]


def test_the_slot_stacks_grow_to_a_larger_rank_and_keep_every_resident_adapter(adapted: Adapted) -> None:
    llm_engine = engine(adapted)
    cfg, dtype = llm_engine.loaded.config, llm_engine.loaded.dtype
    host = {name: load_to_host(cfg, 64, dtype, *key(adapted, name)) for name in NAMES}  # ranks 4, 8, 2
    resident = ResidentStack(cfg, 3, dtype, torch.device("cpu"))
    resident.put(0, host["a"])
    first = resident.stack
    assert first is not None and first.max_rank == 4
    resident.put(1, host["c"])  # rank 2 fits: the same stack
    assert resident.stack is first and resident.rebuilds == 1
    resident.put(2, host["b"])  # rank 8: a new stack, a and c copied in again
    grown = resident.stack
    assert grown is not first and grown is not None and grown.max_rank == 8 and resident.rebuilds == 2
    assert grown.resident == ["a", "c", "b"]
    a_q, _ = host["a"].weights[0, "q_proj"]
    assert torch.equal(grown.modules[0, "q_proj"].a[0, :4], a_q)
    assert first.resident == ["a", "c", None]  # the old stack, which a step in flight may hold, is untouched
    resident.drop(0)
    assert grown.resident == [None, "c", "b"] and float(grown.scales[0]) == 0.0


def test_the_kv_budget_reserves_exactly_the_largest_slot_stacks(adapted: Adapted) -> None:
    cfg = engine(adapted).loaded.config
    stack = LoraStack(cfg, 3, 16, torch.float32, torch.device("cpu"))
    allocated = sum(m.a.nbytes + m.b.nbytes for m in stack.modules.values())
    assert stack_bytes(cfg, 3, 16, torch.float32) == allocated > 0


def test_a_tenant_naming_many_new_adapters_loads_them_in_turn_and_cannot_hold_back_another(
    adapted: Adapted,
) -> None:
    llm_engine = engine(adapted)
    loader = gate(llm_engine)  # loads are held open until the test says
    host = llm_engine.lora.host

    def named(name: str, tenant: str) -> RequestMeta:
        return RequestMeta(tenant_id=tenant, lora=name, lora_path=str(adapted.adapters[name]))

    llm_engine.add_request("flood-a", [1, 2, 3], PARAMS, named("a", "flood"))
    llm_engine.add_request("flood-b", [1, 2, 3], PARAMS, named("b", "flood"))
    assert host.loading(key(adapted, "a")) and not host.loading(key(adapted, "b"))  # b waits its turn
    llm_engine.add_request("other-c", [1, 2, 3], PARAMS, named("c", "other"))
    assert host.loading(key(adapted, "c"))  # another tenant's load starts at once beside it
    loader.gate.set()
    out = run_checked(llm_engine)
    assert sorted(out.tokens) == ["flood-a", "flood-b", "other-c"] and not out.refused
    assert sorted(loader.calls) == ["a", "b", "c"]
