"""Real clients, unchanged, over real HTTP on the real engine: the OpenAI Agents SDK (its chat-completions
model, pointed at this server) runs an agent with two tools end to end: the model's calls are executed by
the SDK, their results go back as tool messages, and the run ends with the model's answer."""

from __future__ import annotations

from typing import Annotated, Literal

import agents  # the dev extra's agent framework (openai-agents)
import openai
import pytest
from pydantic import Field

from tests.gateway.conftest import Server


def _agent(server: Server, calls: list[str], tool_choice: str) -> agents.Agent[None]:
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

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=server.keys["alice"])
    model = agents.OpenAIChatCompletionsModel(model=server.model, openai_client=client)
    return agents.Agent(
        name="helper",
        instructions="Answer with the tools.",
        tools=[get_weather, get_time],
        model=model,
        # After a tool call the SDK resets the choice to auto (reset_tool_choice), so the next turn answers.
        model_settings=agents.ModelSettings(tool_choice=tool_choice, max_tokens=120, temperature=0.0),
    )


@pytest.mark.parametrize("tool_choice", ["required", "get_weather", "get_time"])
def test_an_agent_with_two_tools_runs_end_to_end(server: Server, tool_choice: str) -> None:
    agents.set_tracing_disabled(True)
    calls: list[str] = []
    result = agents.Runner.run_sync(
        _agent(server, calls, tool_choice), "What is the weather in Paris?", max_turns=4
    )
    assert calls, "the agent ran no tool"
    if tool_choice != "required":
        assert {c.split(":")[0] for c in calls} == {tool_choice}
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == kinds.count("tool_call_output_item") == len(calls)
    assert kinds[-1] == "message_output_item" and isinstance(result.final_output, str)
