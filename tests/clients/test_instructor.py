"""instructor, in its TOOLS and JSON_SCHEMA modes, whole and as a stream of partial objects that ends
in a whole one.

instructor 1.17 pins jiter<0.15 while openai 3 (which openai-agents needs) needs jiter>=0.16, so pip
cannot install both from one requirement list: .ci/run installs instructor with --no-deps (it runs with
the newer jiter). A machine without it skips; CI fails instead."""

import importlib.util

import openai
import pytest
from pydantic import BaseModel

from tests.helpers.second_model import is_ci

if importlib.util.find_spec("instructor") is None:
    if is_ci():
        pytest.fail("instructor is not installed, and CI must run its tests (.ci/run installs it)", pytrace=False)
    pytest.skip("instructor not installed: pip install --no-deps instructor docstring-parser", allow_module_level=True)
import instructor  # noqa: E402


class Pet(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_a_response_model_whole_and_streamed(server, model_name, mode) -> None:
    client = instructor.from_openai(openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                                                 timeout=300), mode=getattr(instructor.Mode, mode))
    fields = {"model": model_name, "messages": [{"role": "user", "content": "A pet, please."}],
              "max_tokens": 60, "temperature": 0, "max_retries": 0}
    whole = client.chat.completions.create(response_model=Pet, **fields)
    assert isinstance(whole, Pet)
    # The partial model's schema makes every field optional, so its grammar (and reply) may differ.
    partials = list(client.chat.completions.create_partial(response_model=Pet, **fields))
    assert partials and Pet.model_validate(partials[-1].model_dump())
