"""The OpenAI Agents SDK on its defaults against fairserve: no `set_default_openai_api` call, so the SDK's
own provider picks its default model class, which speaks the Responses API (`POST /v1/responses`). An agent
with two tools runs end to end, whole and streamed: the model's calls are executed by the SDK, their outputs
go back as `function_call_output` items, and the run ends with the model's answer in the agent's output
type (json_schema)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import agents  # the dev extra's agent framework (openai-agents)
import openai
import pytest
from pydantic import BaseModel, Field

from tests.gateway.conftest import Server


class Report(BaseModel):
    """The agent's answer: bounded, so its json_schema grammar closes well within max_tokens."""

    weather: Literal["sunny", "rainy"]


def _agent(calls: list[str], tool_choice: str) -> agents.Agent[None]:
    @agents.function_tool
    def get_weather(city: Literal["paris", "tokyo"]) -> str:
        """The weather in a city."""
        calls.append(f"get_weather:{city}")
        return "sunny, 21 C"

    @agents.function_tool
    def get_time(zone: Annotated[int, Field(ge=-12, le=12)]) -> str:
        """The time in a UTC offset."""
        calls.append(f"get_time:{zone}")
        return "12:00"

    return agents.Agent(
        name="helper",
        instructions="Answer with the tools.",
        tools=[get_weather, get_time],
        # A structured answer (`text.format` json_schema): with the embedded model's random text a free answer
        # would run to max_tokens, which the Responses API reports as `incomplete` and the SDK as a failure.
        output_type=Report,
        # After a tool call the SDK resets the choice to auto (reset_tool_choice), so the next turn answers.
        model_settings=agents.ModelSettings(tool_choice=tool_choice, max_tokens=120, temperature=0.0),
    )


def _config(server: Server) -> tuple[agents.RunConfig, agents.OpenAIProvider]:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    provider = agents.OpenAIProvider(openai_client=client)  # its default API: nothing chosen here
    return agents.RunConfig(model=server.model, model_provider=provider, tracing_disabled=True), provider


@pytest.mark.parametrize(
    ("tool_choice", "stream", "chained"),
    [("required", False, False), ("get_weather", True, False), ("required", False, True)],
)
def test_an_agent_with_two_tools_runs_on_the_sdks_default_api(
    server: Server, tool_choice: str, stream: bool, chained: bool
) -> None:
    """`chained`: the SDK sends each turn's new items only, with `previous_response_id` (the stored
    conversation, gateway/openai/responses_api/store.py), instead of the whole conversation."""
    config, provider = _config(server)
    assert isinstance(provider.get_model(server.model), agents.OpenAIResponsesModel)  # the default: Responses
    calls: list[str] = []
    agent = _agent(calls, tool_choice)
    question = "What is the weather in Paris?"
    if stream:

        async def streamed() -> agents.RunResultStreaming:
            result = agents.Runner.run_streamed(agent, question, run_config=config, max_turns=4)
            async for _ in result.stream_events():
                pass
            return result

        result: agents.RunResultBase = asyncio.run(streamed())
    else:
        result = agents.Runner.run_sync(
            agent, question, run_config=config, max_turns=4, auto_previous_response_id=chained
        )
    assert calls, "the agent ran no tool"
    if tool_choice != "required":
        assert {c.split(":")[0] for c in calls} == {tool_choice}
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == kinds.count("tool_call_output_item") == len(calls)
    assert kinds[-1] == "message_output_item" and isinstance(result.final_output, Report)
    # Every model call was a Responses request of alice's; chained, each turn continued the one before.
    assert len(result.raw_responses) >= 2 and all(r.response_id for r in result.raw_responses)
    ids = [r.response_id or "" for r in result.raw_responses]
    last = server.state.responses.get(server.tenants["alice"].id, ids[-1])
    assert last is not None  # stored, as every response is unless store: false
    assert last.response["previous_response_id"] == (ids[-2] if chained else None)
