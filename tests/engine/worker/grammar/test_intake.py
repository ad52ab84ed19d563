"""Grammar work off the engine loop, on the real engine: a request waits for its compile outside the
scheduler (no seat), compiles are bounded per tenant and taken in turn, a failed or late compile refuses
only its request, compiled grammars are cached per cache group, and grammar CPU is charged as service."""

from __future__ import annotations

import json
import threading

import pytest

from engine import EngineConfig, FinishReason, InvalidRequestError, LLMEngine, RequestMeta, SamplingParams
from engine.core.request import RequestState
from engine.core.sampling_params import Grammar
from engine.worker.grammar.backend import Backend
from engine.worker.grammar.config import GrammarConfig
from engine.worker.loader import LoadedModel, load_model


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, dtype="auto", device="cpu")


class GatedBackend(Backend):
    """The engine's own backend, whose compiles wait for `gate` first (the test decides when they end)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner._tokenizer_json, inner.vocab_size, inner.eos_token_ids, inner.config)
        self.gate = threading.Event()
        self.started: list[str] = []
        self.two_started = threading.Event()

    def compile(self, grammar: Grammar):  # type: ignore[no-untyped-def]
        self.started.append(grammar.source)
        if len(self.started) >= 2:
            self.two_started.set()
        self.gate.wait(60)
        return super().compile(grammar)


def _engine(loaded: LoadedModel, **grammar: object) -> tuple[LLMEngine, GatedBackend]:
    config = EngineConfig(num_kv_blocks=64, max_num_batched_tokens=32, grammar=GrammarConfig(**grammar))  # type: ignore[arg-type]
    engine = LLMEngine(config, loaded=loaded)
    gated = GatedBackend(engine.grammar.compiler.backend)
    engine.grammar.compiler.backend = gated
    return engine, gated


def _schema(n: int) -> Grammar:
    return Grammar(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {f"k{n}": {"type": "boolean"}},
                "required": [f"k{n}"],
                "additionalProperties": False,
            }
        ),
    )


def _params(grammar: Grammar | None) -> SamplingParams:
    return SamplingParams(max_tokens=40, temperature=0.0, grammar=grammar)


def _finish(engine: LLMEngine, limit: int = 2000) -> dict[str, tuple[str, FinishReason | None, float]]:
    done: dict[str, tuple[str, FinishReason | None, float]] = {}
    for _ in range(limit):
        if not engine.has_unfinished():
            return done
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.text, out.finish_reason, out.metrics.charged_service)
    raise AssertionError("the engine did not finish")


def test_a_request_waits_for_its_grammar_without_a_seat(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded)
    engine.add_request("g", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))
    engine.add_request("plain", "hi", _params(None), RequestMeta(tenant_id="b"))
    for _ in range(60):  # the plain request runs to its end while the grammar is held back
        engine.step()
        held = engine.scheduler.requests["g"]  # live, but with no seat and no block
        assert held.state is RequestState.WAITING_FOR_GRAMMAR and held not in engine.scheduler.running
        assert not engine.pool.block_ids("g")
    assert "plain" not in engine.scheduler.requests and engine.grammar.waiting == 1
    gated.gate.set()
    done = _finish(engine)
    assert json.loads(done["g"][0]) in ({"k1": True}, {"k1": False})
    engine.close()


def test_compiles_are_bounded_per_tenant_and_taken_in_turn(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded, compile_threads=2, max_compiles_per_tenant=1)
    for n in range(3):
        engine.add_request(f"a{n}", "hi", _params(_schema(n)), RequestMeta(tenant_id="a"))
    engine.add_request("b0", "hi", _params(_schema(10)), RequestMeta(tenant_id="b"))
    # Tenant a has one compile running; b's starts beside it although a queued two more before it.
    assert gated.two_started.wait(60)  # (the compile threads append as they begin)
    assert sorted(json.loads(s)["required"][0] for s in gated.started) == ["k0", "k10"]
    gated.gate.set()
    done = _finish(engine)
    assert set(done) == {"a0", "a1", "a2", "b0"} and engine.grammar.compiler.compiles == 4
    engine.close()


def test_a_late_compile_refuses_only_its_request(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded, compile_timeout_s=0.05)
    engine.add_request("late", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))
    engine.add_request("plain", "hi", _params(None), RequestMeta(tenant_id="a"))
    refused = []
    for _ in range(10_000):
        engine.step()
        refused += engine.take_refused()
        if refused:
            break
    assert [r for r, _ in refused] == ["late"]
    assert (
        "did not compile within 0.05 s" in str(refused[0][1])
        and refused[0][1].field_name == "response_format"
    )
    gated.gate.set()
    assert _finish(engine)["plain"][1] is FinishReason.LENGTH
    engine.close()


def test_a_failed_compile_refuses_only_its_request_and_is_cached(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded)
    gated.gate.set()
    field = "response_format.json_schema.schema"
    bad = Grammar("json_schema", json.dumps({"type": "array", "uniqueItems": True}), field)
    engine.add_request("bad", "hi", _params(bad), RequestMeta(tenant_id="a"))
    engine.add_request("plain", "hi", _params(None), RequestMeta(tenant_id="a"))
    done = _finish(engine)
    refused = engine.take_refused()
    assert [r for r, _ in refused] == ["bad"] and "uniqueItems" in str(refused[0][1])
    assert refused[0][1].field_name == field
    assert done["plain"][1] is FinishReason.LENGTH and "bad" not in done
    with pytest.raises(InvalidRequestError, match="uniqueItems"):  # the failure is cached: refused at once
        engine.add_request("bad-again", "hi", _params(bad), RequestMeta(tenant_id="a"))
    assert engine.grammar.compiler.compiles == 1
    engine.close()


def test_the_cache_is_per_cache_group_and_an_abort_while_waiting_ends_the_request(
    loaded: LoadedModel,
) -> None:
    engine, gated = _engine(loaded)
    gated.gate.set()
    engine.add_request("a1", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))
    _finish(engine)
    held_before = engine.grammar.waiting
    engine.add_request("a2", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))  # cached: queued at once
    assert held_before == engine.grammar.waiting == 0 and "a2" in engine.scheduler.requests
    engine.add_request("b1", "hi", _params(_schema(1)), RequestMeta(tenant_id="b"))  # another tenant compiles
    assert engine.grammar.waiting == 1
    gated.gate.clear()
    engine.add_request("b2", "hi", _params(_schema(2)), RequestMeta(tenant_id="b"))
    assert engine.abort_request("b2")
    gated.gate.set()
    done = _finish(engine)
    assert done["b2"][1] is FinishReason.CANCELLED
    # a1 and b1 compiled; b2 queued behind b1 (one compile per tenant) and left before it started.
    assert engine.grammar.compiler.compiles == 2
    engine.close()


def test_grammar_cpu_is_charged_as_service(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded, mask_us_per_token=0.001)  # every nanosecond of grammar CPU costs a token
    gated.gate.set()
    engine.add_request("g", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))
    engine.add_request("p", "hi", SamplingParams(max_tokens=40, temperature=0.0), RequestMeta(tenant_id="b"))
    done = _finish(engine)
    tokens = 2 + 2 * len(done["g"][0])  # prompt and output at w_in=1, w_out=2: the plain request's charge
    assert done["g"][2] > 1000 + tokens
    assert done["p"][2] < 1000
    engine.close()


def test_aborting_a_tenants_only_queued_request_leaves_the_compiler_working(loaded: LoadedModel) -> None:
    engine, gated = _engine(loaded)
    engine.add_request("a1", "hi", _params(_schema(1)), RequestMeta(tenant_id="a"))  # compiling (held)
    engine.add_request("a2", "hi", _params(_schema(2)), RequestMeta(tenant_id="a"))  # queued behind it
    assert engine.abort_request("a2")
    engine.add_request("b1", "hi", _params(_schema(3)), RequestMeta(tenant_id="b"))
    gated.gate.set()
    done = _finish(engine)
    assert done["a2"][1] is FinishReason.CANCELLED
    assert {json.loads(done[r][0]).keys() == {k} for r, k in (("a1", "k1"), ("b1", "k3"))} == {True}
    engine.close()
