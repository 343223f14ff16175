"""A model with no chat template (a base model whose vocabulary spells no chat format) serves
/v1/completions and refuses the chat routes with an OpenAI error saying why, not a guessed format."""

import dataclasses

import httpx
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.text.chat_formats import choose_chat_template
from tests.helpers.http import assert_error, post
from tests.helpers.live_server import live_server
from tests.helpers.tiny_gguf import TinySpec, write_tiny_gguf


@pytest.fixture(scope="module")
def base_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base.gguf"
    write_tiny_gguf(path, TinySpec(num_layers=1), drop_keys=("tokenizer.chat_template",))
    engine = Engine(EngineConfig(model_path=path, device="cpu", max_batch=2))
    assert "ChatML" in engine.front.chat_template_origin  # the tiny vocabulary spells ChatML: chosen by its tokens
    # a vocabulary without any chat format's tokens: the engine keeps no template and the reason
    template, origin = choose_chat_template(None, set(), "", "")
    engine.front = dataclasses.replace(engine.front, chat_template=template, chat_template_origin=origin)
    with live_server(engine) as live:
        yield live


def test_completions_serve(base_server) -> None:
    reply = post(base_server.url, "/v1/completions", {"prompt": "the", "max_tokens": 3, "temperature": 0})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_chat_routes_refuse_naming_the_missing_template(base_server, path: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    if path.endswith("completions"):
        body["max_tokens"] = 2
    error = assert_error(post(base_server.url, path, body), 400, param="messages", code="chat_template_missing",
                         mentions=("no chat template", "--chat-template", "/v1/completions"))
    assert "\n" not in error["message"]


def test_tokenizer_info_says_there_is_none(base_server) -> None:
    info = post(base_server.url, "/tokenize", {"prompt": "the"})
    assert info.status_code == 200
    assert httpx.get(base_server.url + "/tokenizer_info").json()["chat_template"] is None
    assert "no chat template" in httpx.get(base_server.url + "/v1/server_info").json()["chat_template"]


def test_token_in_chat_needs_no_template(base_server) -> None:
    """The ids are the whole prompt (docs/rl-rollouts.md): nothing is rendered, so a model without
    a template serves them on chat as completions serves them."""
    body = {"messages": [], "prompt_token_ids": [1, 2, 3], "max_tokens": 3, "temperature": 0,
            "return_token_ids": True}
    reply = post(base_server.url, "/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    plain = post(base_server.url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0,
                                                      "return_token_ids": True}).json()
    assert reply.json()["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
