"""`n > 1` over real HTTP with the official client: n choices of one prompt on both endpoints, whole and
streamed (events interleaved, each naming its index), each with its own finish_reason; the cap's 400;
and the charge and the ledger: one prefill plus n decodes, one usage row summing the choices."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, cast

import httpx
import jsonschema
import openai
import pytest

from tests.gateway.conftest import Server, wait_for
from tests.gateway.openai.test_structured import PERSON, Answer
from tests.gateway.openai.test_tools import WEATHER


@pytest.fixture()
def oa(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0)


GREEDY: dict[str, Any] = {"max_tokens": 6, "temperature": 0, "extra_body": {"ignore_eos": True}}
SAMPLED: dict[str, Any] = {
    "max_tokens": 10,
    "temperature": 1.0,
    "seed": 11,
    "extra_body": {"ignore_eos": True},
}
MESSAGES: list[Any] = [{"role": "user", "content": "name three colours"}]


def test_completions_n3_whole_greedy_choices_equal_the_single_answer(
    server: Server, oa: openai.OpenAI
) -> None:
    one = oa.completions.create(model=server.model, prompt="Once upon", **GREEDY)
    three = oa.completions.create(model=server.model, prompt="Once upon", n=3, **GREEDY)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert all(c.text == one.choices[0].text and c.finish_reason == "length" for c in three.choices)
    assert three.usage is not None and three.usage.completion_tokens == 3 * 6
    assert three.usage.prompt_tokens == one.usage.prompt_tokens if one.usage else False


def test_chat_n3_whole_sampled_choices_differ(server: Server, oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(model=server.model, messages=MESSAGES, n=3, **SAMPLED)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.message.content for c in reply.choices]
    assert all(c.message.role == "assistant" for c in reply.choices)
    assert len(set(texts)) == 3, texts
    assert reply.usage is not None and reply.usage.completion_tokens == 3 * 10
    again = oa.chat.completions.create(model=server.model, messages=MESSAGES, n=3, **SAMPLED)
    assert [c.message.content for c in again.choices] == texts  # seeded: each choice repeats


def _param(err: openai.APIStatusError) -> object:
    """The `param` of an error reply, as the client parsed its body."""
    body = err.body
    return body.get("param") if isinstance(body, dict) else None


def _streamed(events: list[Any], chat: bool) -> tuple[list[int], dict[int, str], dict[int, list[str]], Any]:
    """Each event's choice index in order, each choice's text and finish reasons, and the final usage."""
    order: list[int] = []
    texts: dict[int, str] = defaultdict(str)
    reasons: dict[int, list[str]] = defaultdict(list)
    usage = None
    for event in events:
        if event.usage is not None:
            usage = event.usage
        for choice in event.choices:
            order.append(choice.index)
            texts[choice.index] += (choice.delta.content or "") if chat else choice.text
            if choice.finish_reason is not None:
                reasons[choice.index].append(choice.finish_reason)
    return order, dict(texts), dict(reasons), usage


@pytest.mark.parametrize("chat", [False, True])
def test_streams_interleave_the_choices_by_index(server: Server, oa: openai.OpenAI, chat: bool) -> None:
    ask: dict[str, Any] = {**GREEDY, "model": server.model, "n": 3}
    if chat:
        whole = oa.chat.completions.create(messages=MESSAGES, **ask)
        events = list(
            oa.chat.completions.create(
                messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **ask
            )
        )
        expected = [c.message.content for c in whole.choices]
    else:
        whole_completion = oa.completions.create(prompt="Once upon", **ask)
        events = list(
            oa.completions.create(
                prompt="Once upon", stream=True, stream_options={"include_usage": True}, **ask
            )
        )
        expected = [c.text for c in whole_completion.choices]
    order, texts, reasons, usage = _streamed(events, chat)
    assert [texts[i] for i in range(3)] == expected
    assert reasons == {i: ["length"] for i in range(3)}  # each choice's last event, once
    assert min(i for i, x in enumerate(order) if x == 1) < max(i for i, x in enumerate(order) if x == 0)
    assert usage is not None and usage.completion_tokens == 3 * 6


def test_each_choice_has_its_own_finish_reason(server: Server, oa: openai.OpenAI) -> None:
    free = oa.completions.create(model=server.model, prompt="Once upon", n=2, **SAMPLED)
    text0, text1 = free.choices[0].text, free.choices[1].text
    stop = next(c for c in text0 if c.strip() and c not in text1)  # ends choice 0, never choice 1
    stopped = oa.completions.create(model=server.model, prompt="Once upon", n=2, stop=[stop], **SAMPLED)
    first, second = stopped.choices
    assert (first.finish_reason, first.text) == ("stop", text0[: text0.index(stop)])
    assert (second.finish_reason, second.text) == ("length", text1)
    events = list(
        oa.completions.create(
            model=server.model, prompt="Once upon", n=2, stop=[stop], stream=True, **SAMPLED
        )
    )
    _, texts, reasons, _ = _streamed(events, chat=False)
    assert reasons == {0: ["stop"], 1: ["length"]}
    assert texts == {0: first.text, 1: second.text}


def test_n_over_the_cap_is_a_400_naming_n(server: Server, client: httpx.Client) -> None:
    cap = server.state.engine.caps.max_n
    for n, endpoint, body in (
        (cap + 1, "/v1/completions", {"prompt": "hi"}),
        (cap + 1, "/v1/chat/completions", {"messages": MESSAGES}),
        (0, "/v1/completions", {"prompt": "hi"}),
    ):
        resp = client.post(
            endpoint, json={**body, "model": server.model, "n": n}, headers=server.headers("alice")
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "n"
    with pytest.raises(openai.BadRequestError) as err:
        openai.OpenAI(
            base_url=server.url + "/v1", api_key=server.keys["alice"], max_retries=0
        ).completions.create(model=server.model, prompt="hi", n=cap + 1)
    assert _param(err.value) == "n"


def test_a_required_tool_call_with_n_gives_each_choice_its_call(server: Server, oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(
        model=server.model,
        messages=MESSAGES,
        tools=[WEATHER],
        tool_choice="required",
        n=2,
        max_tokens=120,
        temperature=1.0,
        seed=5,
    )
    assert [c.index for c in reply.choices] == [0, 1]
    for choice in reply.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        assert isinstance(json.loads(call.function.arguments), dict)


def test_json_schema_with_n_gives_choices_that_each_validate(server: Server, oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=cast(
            Any, {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
        ),
        n=3,
        max_tokens=200,
        temperature=1.0,
        seed=2,
    )
    contents = [c.message.content or "" for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2] and len(set(contents)) == 3
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), PERSON)


def test_streamed_json_object_with_n_interleaves_choices_that_each_parse(
    server: Server, oa: openai.OpenAI
) -> None:
    events = list(
        oa.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": "Some JSON, please."}],
            response_format={"type": "json_object"},
            n=2,
            max_tokens=120,
            temperature=1.0,
            seed=9,
            stream=True,
        )
    )
    order, texts, reasons, _ = _streamed(events, chat=True)
    assert set(order) == {0, 1} and order != sorted(order), "the two choices' events interleave"
    assert reasons == {0: ["stop"], 1: ["stop"]}
    assert all(isinstance(json.loads(texts[i]), dict) for i in (0, 1))


def test_openai_parse_with_n_returns_a_parsed_object_per_choice(server: Server, oa: openai.OpenAI) -> None:
    completion = oa.chat.completions.parse(
        model=server.model,
        messages=[{"role": "user", "content": "A city?"}],
        response_format=Answer,
        n=2,
        max_tokens=200,
        temperature=1.0,
        seed=4,
    )
    assert [type(c.message.parsed) for c in completion.choices] == [Answer, Answer]


def test_tools_offered_with_n_parse_each_choice(server: Server, oa: openai.OpenAI) -> None:
    reply = oa.chat.completions.create(model=server.model, messages=MESSAGES, tools=[WEATHER], n=2, **GREEDY)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content == reply.choices[1].message.content
    events = list(
        oa.chat.completions.create(
            model=server.model, messages=MESSAGES, tools=[WEATHER], n=2, stream=True, **GREEDY
        )
    )
    _, texts, reasons, _ = _streamed(events, chat=True)
    assert texts == {0: reply.choices[0].message.content, 1: reply.choices[1].message.content}
    assert set(reasons) == {0, 1}


def test_n4_is_charged_one_prefill_and_four_decodes_in_one_ledger_row(server: Server) -> None:
    server.add_tenant("choices-charge")
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys["choices-charge"], max_retries=0)
    raw = oa.completions.with_raw_response.create(
        model=server.model, prompt="a prompt this tenant sends once, charged once", n=4, **GREEDY
    )
    reply = raw.parse()
    assert reply.usage is not None and reply.usage.completion_tokens == 4 * 6
    rows = server.usage_rows("request_id = :rid", rid=raw.headers["x-request-id"])
    assert len(rows) == 1
    row = rows[0]
    assert (row["prompt_tokens"], row["completion_tokens"], row["status"]) == (
        reply.usage.prompt_tokens,
        4 * 6,
        "completed",
    )
    fairness = server.state.settings.engine.fairness
    computed = row["prompt_tokens"] - row["cached_tokens"]
    one_prefill = fairness.w_in * computed + fairness.w_cached * row["cached_tokens"] + fairness.w_out * 4 * 6
    four_prefills = one_prefill + 3 * fairness.w_in * computed
    assert row["charged_service"] == pytest.approx(one_prefill)
    assert row["charged_service"] < four_prefills
    tenant = server.tenants["choices-charge"].id
    assert server.state.engine.stats().service.get(tenant) == pytest.approx(one_prefill)


def test_the_quota_counts_n_times_max_tokens(server: Server, client: httpx.Client) -> None:
    server.add_tenant("choices-quota", tokens_per_minute=100)
    body = {"model": server.model, "prompt": "hello", "max_tokens": 40, "ignore_eos": True}
    # prompt + 3 x 40 is over the whole 100 tokens a minute (never admissible); prompt + 40 alone is not.
    three = client.post("/v1/completions", json={**body, "n": 3}, headers=server.headers("choices-quota"))
    assert three.status_code == 400, three.text
    assert three.json()["error"]["code"] == "quota_exceeds_limit"
    one = client.post("/v1/completions", json=body, headers=server.headers("choices-quota"))
    assert one.status_code == 200, one.text


def test_a_disconnect_mid_stream_ends_every_choice_and_frees_their_blocks(server: Server) -> None:
    engine = server.state.engine
    wait_for(lambda: engine.stats().running == 0, 30, "idle engine")
    baseline = engine.stats().kv_blocks_used
    body = {
        "model": server.model,
        "prompt": "three choices, then a hang-up " * 4,
        "max_tokens": 300,
        "ignore_eos": True,
        "n": 3,
        "stream": True,
    }
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream(
            "POST",
            "/v1/completions",
            json=body,
            headers=server.headers("alice", **{"X-Request-Id": "n-gone"}),
        ) as resp,
    ):
        seen: set[int] = set()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                seen.update(choice["index"] for choice in json.loads(line[6:])["choices"])
            if seen == {0, 1, 2}:
                break
        assert engine.stats().running == 3  # the three choices run at once
    wait_for(lambda: engine.stats().running == 0, 10, "every choice aborted")
    wait_for(lambda: engine.stats().kv_blocks_used <= baseline, 10, "KV blocks freed")
    row = wait_for(lambda: server.usage_rows("request_id = 'n-gone'"), 10, "ledger row")[0]
    assert row["status"] == "cancelled" and 3 <= row["completion_tokens"] < 3 * 300
