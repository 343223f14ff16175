"""pydantic-ai (the chat completions API): a function tool and an output type, whose final answer is an
output tool the agent must call (tool_choice `required`), streamed and not."""

import asyncio

import pytest
from pydantic import BaseModel, Field

from tests.clients.conftest import QUESTION, weather

pydantic_ai = pytest.importorskip("pydantic_ai")
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402


class Forecast(BaseModel):
    # Bounded, so the grammar ends each string in time for max_tokens (a small model writes long strings).
    city: str = Field(max_length=30)
    summary: str = Field(max_length=60)


def _agent(server, model_name: str, calls: list[str]) -> "pydantic_ai.Agent":
    model = OpenAIChatModel(model_name, provider=OpenAIProvider(base_url=f"{server.url}/v1", api_key="none"))
    agent = pydantic_ai.Agent(model, output_type=Forecast, retries=2,
                              model_settings={"temperature": 0, "max_tokens": 120})

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city now."""
        calls.append(city)
        return weather(city)

    return agent


def test_a_tool_and_an_output_type(server, model_name) -> None:
    calls: list[str] = []
    result = _agent(server, model_name, calls).run_sync(QUESTION)
    assert isinstance(result.output, Forecast) and result.output.city
    assert all(isinstance(city, str) for city in calls)


def test_streamed(server, model_name) -> None:
    calls: list[str] = []

    async def run() -> Forecast:
        async with _agent(server, model_name, calls).run_stream(QUESTION) as result:
            return await result.get_output()

    output = asyncio.run(run())
    assert isinstance(output, Forecast) and output.city
