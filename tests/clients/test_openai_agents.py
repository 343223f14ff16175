"""openai-agents (the Responses API): a function tool's whole round (the SDK's `required` first turn, then
its reset to no tool_choice, which is `auto`), the SDK's default settings, streamed and not, and
`output_type`."""

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.clients.conftest import INSTRUCTIONS, QUESTION, weather

agents = pytest.importorskip("agents")
agents.set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers


def _model(server, model_name: str, recorder) -> "agents.OpenAIResponsesModel":
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300,
                         http_client=httpx.AsyncClient(event_hooks={"request": [recorder.async_hook]}))
    return agents.OpenAIResponsesModel(model_name, client)


def _weather_tool(calls: list[str]):
    """The SDK's function tool, noting each city it is called with in `calls`."""
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        calls.append(city)
        return weather(city)

    return get_weather


def _run(agent, question: str, streamed: bool):
    async def run():
        if not streamed:
            return await agents.Runner.run(agent, question, max_turns=3)
        result = agents.Runner.run_streamed(agent, question, max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    return asyncio.run(run())


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_ends_in_an_answer(server, model_name, recorder, streamed) -> None:
    calls: list[str] = []
    get_weather = _weather_tool(calls)
    agent = agents.Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather],
                         model=_model(server, model_name, recorder),
                         model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                             temperature=0, max_tokens=60))
    result = _run(agent, QUESTION, streamed)
    assert len(calls) == 1 and calls[0]  # one call, its arguments parsed into the tool's own signature
    assert isinstance(result.final_output, str) and result.final_output
    first, second = recorder.bodies[0], recorder.bodies[1]
    assert first["tool_choice"] == "required"
    # The SDK resets tool_choice after a call so its loop cannot repeat forever: the second request offers
    # the tool with no tool_choice (auto), the call and its result in its input.
    assert "tool_choice" not in second and second["tools"][0]["name"] == "get_weather"
    kinds = [item.get("type") for item in second["input"]]
    assert "function_call" in kinds and "function_call_output" in kinds
    assert len(recorder.bodies) == 2


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_the_sdks_default_tool_settings(server, model_name, recorder, streamed) -> None:
    """Tools offered and no tool_choice, as the SDK sends them by default: the model answers (in text or by
    calling) and the run ends; before the server taught its own call format, this was a 400 on both
    packaged models. Greedy, so the reply ends within max_tokens: the SDK fails a reply cut short (its
    default temperature samples, and a 135M model can ramble past any bound)."""
    calls: list[str] = []
    get_weather = _weather_tool(calls)
    agent = agents.Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather],
                         model=_model(server, model_name, recorder),
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=60))
    result = _run(agent, "Say hello in five words.", streamed)
    assert isinstance(result.final_output, str)
    assert recorder.bodies[0]["tools"][0]["name"] == "get_weather" and "tool_choice" not in recorder.bodies[0]
    assert len(recorder.bodies) == len(calls) + 1  # each call answered by one more request, then the end


def test_output_type(server, model_name, recorder) -> None:
    class Pet(BaseModel):
        name: str
        age: int

    agent = agents.Agent(name="pets", instructions="Make up a pet.", output_type=Pet,
                         model=_model(server, model_name, recorder),
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=60))
    result = _run(agent, "A pet, please.", streamed=False)
    assert isinstance(result.final_output, Pet)
    assert json.loads(Pet.model_validate(result.final_output).model_dump_json())
