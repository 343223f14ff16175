"""A request naming the model while it loads: a 503 saying so (Retry-After), not a 404 claiming
this server serves '' (without --served-model-name the name is the file's, unknown until loaded)."""

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.server.chat.plan import plan_chat
from batchproof.server.chat.protocol import ChatCompletionRequest
from batchproof.server.completions.plan import plan_completions
from batchproof.server.completions.protocol import CompletionRequest
from batchproof.server.config import ServerConfig
from batchproof.server.errors import APIError
from batchproof.server.state import ServerState

NAME = "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.parametrize("plan", ["chat", "completions"])
def test_a_request_naming_the_model_while_it_loads_is_a_503(plan: str) -> None:
    state = ServerState(ServerConfig(), EngineConfig(device="cpu"))  # no backend yet: loading
    with pytest.raises(APIError) as raised:
        if plan == "chat":
            plan_chat(ChatCompletionRequest(model=NAME, messages=[{"role": "user", "content": "hi"}]), state, None)
        else:
            plan_completions(CompletionRequest(model=NAME, prompt="hi"), state, None)
    assert raised.value.status == 503 and "still loading" in raised.value.message
    assert raised.value.headers == {"Retry-After": "1"}


def test_once_loaded_another_name_is_still_a_404_naming_both() -> None:
    state = ServerState(ServerConfig(), EngineConfig(device="cpu"), served_model_name=NAME)
    state.backend = type("Loaded", (), {"engine": object()})()  # loaded: only the name is asked here
    with pytest.raises(APIError) as raised:
        plan_chat(ChatCompletionRequest(model="gpt-4o", messages=[{"role": "user", "content": "hi"}]), state, None)
    assert raised.value.status == 404
    assert "'gpt-4o' does not exist" in raised.value.message and NAME in raised.value.message
