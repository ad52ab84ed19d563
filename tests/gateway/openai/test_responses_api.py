"""The Responses API through the official client over real HTTP on the real engine: whole and streamed (the
typed event stream the client's own accumulator checks), function tools and their outputs fed back,
json_schema through `responses.parse`, `max_output_tokens`, stored responses continued by
`previous_response_id` and never readable by another tenant, refusals naming the Responses field, and
image parts refused as not supported (here and on chat completions)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import FunctionToolParam, Response, ResponseStreamEvent
from pydantic import BaseModel, Field, TypeAdapter

from fairserve_client import FairServe
from gateway.openai.responses_api.events import EventStream
from gateway.openai.responses_api.schemas import ResponsesRequest
from tests.gateway.conftest import Server

WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Verdict(BaseModel):
    ok: bool
    n: int = Field(ge=0, le=9)


def _client(server: Server, tenant: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=server.keys[tenant], max_retries=0)


def test_whole_response_goes_through_the_chat_pipeline(server: Server) -> None:
    reply = _client(server).responses.create(
        model=server.model, input="Say hello.", instructions="Be brief.", max_output_tokens=8
    )
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.usage is not None and 1 <= reply.usage.output_tokens <= 8
    if reply.status == "incomplete":  # cut at max_output_tokens
        assert reply.incomplete_details is not None
        assert reply.incomplete_details.reason == "max_output_tokens"
        assert reply.usage.output_tokens == 8
    else:
        assert reply.status == "completed"
    assert reply.instructions == "Be brief." and reply.max_output_tokens == 8
    plain = _client(server).responses.create(model=server.model, input="Say hello.", max_output_tokens=1)
    spelled = _client(server).responses.create(
        model=server.model,
        input=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        max_output_tokens=1,
    )
    assert plain.usage is not None and spelled.usage is not None
    assert reply.usage.input_tokens == spelled.usage.input_tokens > plain.usage.input_tokens  # a system turn
    # The chat pipeline served it: the ledger has its row under the request id the response id carries.
    rows = server.usage_rows(
        "request_id = :id AND tenant_id = :t", id=reply.id.removeprefix("resp_"), t=server.tenants["alice"].id
    )
    assert len(rows) == 1 and rows[0]["completion_tokens"] == reply.usage.output_tokens


def test_streamed_events_are_typed_numbered_and_add_up(server: Server) -> None:
    events = list(
        _client(server).responses.create(
            model=server.model, input="Count.", max_output_tokens=12, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text
    if deltas:
        assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
        assert kinds.index("response.output_text.done") < kinds.index("response.output_item.done")
    assert final.usage is not None and final.usage.output_tokens <= 12
    # The client's own accumulator (item identities, their order) takes the same stream; its
    # `get_final_response` wants `response.completed`, which a reply cut short is not (as on OpenAI).
    with _client(server).responses.stream(model=server.model, input="Count.", max_output_tokens=12) as stream:
        last = [e.type for e in stream][-1]
    assert last in ("response.completed", "response.incomplete")


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_call_and_its_output_fed_back(server: Server, stream: bool) -> None:
    api = _client(server)
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw: dict[str, Any] = {"model": server.model, "tools": [WEATHER], "max_output_tokens": 100}
    if stream:
        with api.responses.stream(input=ask, tool_choice="required", **kw) as events:
            deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
            called = events.get_final_response()
    else:
        called = api.responses.create(input=ask, tool_choice="required", **kw)
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    if stream:
        assert deltas == "".join(c.arguments for c in calls)
    outputs: list[Any] = [
        {"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21 C"} for c in calls
    ]
    fed: list[Any] = [*ask, *called.output, *outputs]
    # Fed back as the Agents SDK does: the earlier output items, then the calls' outputs.
    answered = api.responses.create(
        model=server.model, tools=[WEATHER], max_output_tokens=100, input=fed, tool_choice="none"
    )
    assert not [item for item in answered.output if item.type == "function_call"]
    # Continued by id instead: only the outputs are sent, the stored call comes first.
    continued = api.responses.create(
        model=server.model,
        tools=[WEATHER],
        max_output_tokens=100,
        input=outputs,
        previous_response_id=called.id,
        tool_choice="none",
    )
    assert continued.usage is not None and answered.usage is not None
    assert continued.usage.input_tokens == answered.usage.input_tokens


def test_json_schema_through_parse(server: Server) -> None:
    parsed = _client(server).responses.parse(
        model=server.model, input="Give a verdict.", text_format=Verdict, max_output_tokens=100
    )
    assert isinstance(parsed.output_parsed, Verdict)


def test_previous_response_id_continues_the_stored_conversation(server: Server) -> None:
    api = _client(server)
    first = api.responses.create(model=server.model, input="hello", max_output_tokens=6)
    second = api.responses.create(
        model=server.model, input="more", previous_response_id=first.id, max_output_tokens=6
    )
    spelled = api.responses.create(
        model=server.model,
        input=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "more"},
        ],
        max_output_tokens=6,
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and spelled.usage is not None
    assert second.usage.input_tokens == spelled.usage.input_tokens  # the same conversation, rendered alike
    again = api.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    unstored = api.responses.create(model=server.model, input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(unstored.id)


def test_another_tenants_response_is_exactly_an_unknown_one(server: Server, client: httpx.Client) -> None:
    alice, bob = server.headers("alice"), server.headers("bob")
    made = _client(server).responses.create(model=server.model, input="secret", max_output_tokens=2)
    follow = {
        "model": server.model,
        "input": "go on",
        "previous_response_id": made.id,
        "max_output_tokens": 2,
    }
    theirs = client.get(f"/v1/responses/{made.id}", headers=bob)
    theirs_continued = client.post("/v1/responses", json=follow, headers=bob)
    assert client.get(f"/v1/responses/{made.id}", headers=alice).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _client(server, "bob").responses.retrieve(made.id)
    assert client.delete(f"/v1/responses/{made.id}", headers=alice).status_code == 200
    unknown = client.get(f"/v1/responses/{made.id}", headers=alice)
    unknown_continued = client.post("/v1/responses", json=follow, headers=alice)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.content == unknown.content
    assert theirs_continued.status_code == unknown_continued.status_code == 404
    assert theirs_continued.content == unknown_continued.content
    assert theirs_continued.json()["error"]["param"] == "previous_response_id"


def test_refusals_name_the_responses_field(server: Server, client: httpx.Client) -> None:
    api = _client(server)
    with pytest.raises(openai.BadRequestError) as zero:
        api.responses.create(model=server.model, input="x", max_output_tokens=0)
    assert zero.value.param == "max_output_tokens"
    # the message names the field the client sent, not the chat field it became
    assert "max_output_tokens must be >= 1" in zero.value.message and "completion" not in zero.value.message
    with pytest.raises(openai.BadRequestError) as long:
        api.responses.create(model=server.model, input="x", max_output_tokens=10**6)
    assert long.value.param == "max_output_tokens" and "max_output_tokens=1000000" in long.value.message


def test_unknown_field_is_named(server: Server, client: httpx.Client) -> None:
    body = {"model": server.model, "input": "x", "frobnicate": 1}
    reply = client.post("/v1/responses", json=body, headers=server.headers("alice"))
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "frobnicate"


IMAGE = "data:image/png;base64,iVBORw0KGgo="


def test_images_are_refused_as_not_supported(server: Server) -> None:
    api = _client(server)
    with pytest.raises(openai.BadRequestError) as chat:
        api.chat.completions.create(
            model=server.model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is it?"},
                        {"type": "image_url", "image_url": {"url": IMAGE}},
                    ],
                }
            ],
        )
    assert chat.value.status_code == 400 and "not supported" in chat.value.message
    assert "'image_url'" in chat.value.message and chat.value.param == "messages.0.content"
    with pytest.raises(openai.BadRequestError) as audio:
        api.chat.completions.create(
            model=server.model,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
                }
            ],
        )
    assert "not supported" in audio.value.message and "'input_audio'" in audio.value.message
    with pytest.raises(openai.BadRequestError) as responses:
        api.responses.create(
            model=server.model,
            input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": IMAGE, "detail": "auto"}]}
            ],
        )
    assert "not supported" in responses.value.message and responses.value.param == "input"


@pytest.mark.parametrize("stream", [False, True])
def test_an_idempotent_retry_replays_the_same_response(
    server: Server, client: httpx.Client, stream: bool
) -> None:
    body = {"model": server.model, "input": "once", "max_output_tokens": 4, "stream": stream}
    headers = server.headers("alice", **{"Idempotency-Key": f"responses-replay-{stream}"})
    first = client.post("/v1/responses", json=body, headers=headers)
    again = client.post("/v1/responses", json=body, headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.content == again.content  # the stored chat reply, translated the same way: the same id


def test_a_run_failing_mid_stream_ends_in_error_and_response_failed() -> None:
    """The chat stream's error frame (an engine failure after the first event) becomes `error` and
    `response.failed`, and its trailing [DONE] adds no `response.completed`."""
    body = ResponsesRequest.model_validate({"model": "m", "input": "x"})
    stream = EventStream(body)
    head = {
        "id": "req-1",
        "created": 1,
        "choices": [{"index": 0, "delta": {"content": "ab"}, "finish_reason": None}],
    }
    kinds = [e["type"] for e in stream.chunk(head)]
    error = {
        "message": "the engine failed while generating this request",
        "code": "engine_error",
        "param": None,
    }
    failed = stream.failed(error)
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    assert [e["type"] for e in failed] == ["error", "response.failed"]
    assert (
        failed[1]["response"]["status"] == "failed"
        and failed[1]["response"]["error"]["code"] == "engine_error"
    )
    assert stream.end() == [] and stream.final is None
    numbers = [e["sequence_number"] for e in failed]
    assert numbers == [len(kinds), len(kinds) + 1]


@pytest.mark.parametrize("shape", ["items", "parts"])
def test_too_many_items_or_parts_are_counted_before_validation(
    server: Server, client: httpx.Client, shape: str
) -> None:
    cap = server.state.settings.max_chat_messages
    part = {"type": "input_text", "text": "hello there"}
    items: list[Any] = (
        [{"role": "user", "content": "hello there"}] * (cap + 1)
        if shape == "items"
        else [{"role": "user", "content": [part] * (cap + 1)}]
    )
    reply = client.post(
        "/v1/responses", json={"model": server.model, "input": items}, headers=server.headers("alice")
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "input" and f"at most {cap}" in error["message"]
    assert ("items" if shape == "items" else "content parts") in error["message"]


@pytest.mark.parametrize("tools", [False, True])
def test_every_event_and_body_validates_against_the_clients_types(
    server: Server, client: httpx.Client, tools: bool
) -> None:
    """The official client builds its objects without validating them; here each event and body is validated
    strictly against its type (openai.types.responses), so a missing or mistyped field fails."""
    body: dict[str, Any] = {"model": server.model, "input": "Weather in Paris?", "max_output_tokens": 100}
    if tools:
        body |= {"tools": [WEATHER], "tool_choice": "required"}
    whole = client.post("/v1/responses", json=body, headers=server.headers("alice"))
    assert whole.status_code == 200
    Response.model_validate(whole.json())
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    with client.stream(
        "POST", "/v1/responses", json={**body, "stream": True}, headers=server.headers("alice")
    ) as stream:
        frames = "".join(stream.iter_text()).strip().split("\n\n")
    kinds = []
    for frame in frames:
        event_line, data_line = frame.split("\n")
        event = adapter.validate_python(json.loads(data_line.removeprefix("data: ")))
        assert event_line == f"event: {event.type}"
        kinds.append(event.type)
    if tools:
        assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"


def test_parallel_calls_are_each_done_before_the_next_is_added() -> None:
    """Two calls in one chat stream: the first is done (arguments, item) as the second begins, as OpenAI
    streams them, and the final Response holds both, whole."""
    stream = EventStream(ResponsesRequest.model_validate({"model": "m", "input": "x"}))

    def chunk(delta: dict[str, Any], reason: str | None = None) -> list[dict[str, Any]]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        return stream.chunk({"id": "req-2", "created": 1, "choices": [choice]})

    def call(index: int, head: bool, arguments: str) -> dict[str, Any]:
        function = {"name": "f", "arguments": arguments} if head else {"arguments": arguments}
        return {
            "index": index,
            **({"id": f"call_{index}", "type": "function"} if head else {}),
            "function": function,
        }

    events = chunk({"role": "assistant", "tool_calls": [call(0, True, '{"a":')]})
    events += chunk({"tool_calls": [call(0, False, "1}")]})
    events += chunk({"tool_calls": [call(1, True, '{"a":2}')]})
    events += chunk({}, "tool_calls")
    events += stream.end()
    flow = [
        (e["type"], e.get("output_index"))
        for e in events
        if e["type"].startswith("response.function_call") or e["type"].startswith("response.output_item")
    ]
    assert flow == [
        ("response.output_item.added", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.delta", 0),
        ("response.function_call_arguments.done", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
    ]
    assert stream.final is not None and stream.final["status"] == "completed"
    assert [(o["call_id"], o["arguments"], o["status"]) for o in stream.final["output"]] == [
        ("call_0", '{"a":1}', "completed"),
        ("call_1", '{"a":2}', "completed"),
    ]


def test_fairserve_client_calls_carry_their_identity_through(server: Server) -> None:
    """FairServe (fairserve_client) on the Responses API: its task, workflow run and deadline headers reach
    the ledger row of the chat pipeline that served it, as on chat completions."""
    client = FairServe(base_url=server.url + "/v1", api_key=server.keys["alice"], deadline_in=30)
    with client.task() as task:
        reply = client.responses.create(model=server.model, input="hi", max_output_tokens=2)
    rows = server.usage_rows(
        "request_id = :id AND tenant_id = :t", id=reply.id.removeprefix("resp_"), t=server.tenants["alice"].id
    )
    assert len(rows) == 1
    assert rows[0]["task_id"] == task.id and rows[0]["workflow_run_id"] == client.fairserve.workflow_run_id
