"""langchain-openai: `bind_tools` and a tool loop (a forced call, its result as a ToolMessage, then an
answer with the tool still offered: `auto`), streamed and not; and `with_structured_output`."""

import json
from functools import reduce
from operator import add

import jsonschema
import pytest
from pydantic import BaseModel

from tests.clients.conftest import INSTRUCTIONS, QUESTION, WEATHER_SCHEMA, weather

langchain_openai = pytest.importorskip("langchain_openai")
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402


@tool
def get_weather(city: str) -> str:
    """The weather in a city now."""
    return weather(city)


def _llm(server, model_name: str) -> "langchain_openai.ChatOpenAI":
    return langchain_openai.ChatOpenAI(model=model_name, base_url=f"{server.url}/v1", api_key="none",
                                       temperature=0, max_tokens=60, max_retries=0, timeout=300)


def _ask(runnable, messages, streamed: bool):
    return reduce(add, runnable.stream(messages)) if streamed else runnable.invoke(messages)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_tool_loop(server, model_name, streamed) -> None:
    llm = _llm(server, model_name)
    messages = [SystemMessage(INSTRUCTIONS), HumanMessage(QUESTION)]
    called = _ask(llm.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False), messages,
                  streamed)
    assert len(called.tool_calls) == 1 and called.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(called.tool_calls[0]["args"], WEATHER_SCHEMA)
    messages += [called, ToolMessage(get_weather.invoke(called.tool_calls[0]["args"]),
                                     tool_call_id=called.tool_calls[0]["id"])]
    answer = _ask(llm.bind_tools([get_weather]), messages, streamed)  # auto: text, or a valid call
    for call in answer.tool_calls:
        jsonschema.validate(call["args"], WEATHER_SCHEMA)
    assert answer.content or answer.tool_calls
    assert answer.response_metadata.get("finish_reason") in ("stop", "tool_calls")


def test_with_structured_output(server, model_name) -> None:
    class Pet(BaseModel):
        name: str
        age: int

    pet = _llm(server, model_name).with_structured_output(Pet).invoke("A pet, please, as JSON.")
    assert isinstance(pet, Pet)
    assert json.loads(pet.model_dump_json())
