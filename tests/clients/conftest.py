"""The agent SDKs people point at an OpenAI server, run unchanged against ours (the default model, a
live server on loopback). A tiny model may answer poorly: the tests assert the protocol (a call
parsed, its arguments valid for its schema, the tool's result accepted, the loop ends), not the
wisdom of the answers."""

import json

import pytest

# The SDKs' tools: the model is asked about Paris, and the tool answers from a fixed table.
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                  "additionalProperties": False}
QUESTION = "What is the weather in Paris?"
# A plain system turn: "answer with the tools" makes the 135M model call again after every result.
INSTRUCTIONS = "You are a helpful assistant."


def weather(city: str) -> str:
    return json.dumps({"city": city, "temperature_c": 18, "sky": "sunny"})


class Recorder:
    """The bodies an SDK sent (an httpx event hook), so a test can say what each request asked."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    def hook(self, request) -> None:
        if request.method == "POST" and request.content:
            self.bodies.append(json.loads(request.content))

    async def async_hook(self, request) -> None:
        self.hook(request)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return server.state.served_model_name
