"""GET /tokenizer_info, POST /tokenize (prompt or messages, add_special_tokens, token strings)
and POST /detokenize, in the shapes vLLM serves and lm-eval's remote tokenizer reads."""

import httpx

from tests.helpers.http import assert_error, post


def test_tokenizer_info_names_the_special_tokens(server, engine) -> None:
    info = httpx.get(server.url + "/tokenizer_info").json()
    ids = engine.tokenizer.ids
    assert info["eos_token"] == engine.tokenizer.spelling(ids.eos_id) == "<|im_end|>"
    assert info["eos_token_id"] == ids.eos_id and info["bos_token_id"] == ids.bos_id
    assert info["bos_token"] == "<|im_start|>" and info["pad_token_id"] == ids.pad_id
    assert info["model_max_length"] == engine.max_model_len
    assert info["chat_template"] == engine.front.chat_template.source
    for name in ("bos", "eos", "pad"):  # each spelling tokenizes back to its id, as lm-eval relies on
        tokens = post(server.url, "/tokenize", {"prompt": info[f"{name}_token"], "add_special_tokens": False})
        assert tokens.json()["tokens"] == [info[f"{name}_token_id"]]


def test_tokenize_a_prompt_and_messages(server, engine) -> None:
    reply = post(server.url, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert reply["tokens"] == engine.tokenizer.encode("Hello world", add_bos=engine.tokenizer.ids.add_bos)
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] == engine.max_model_len
    assert "".join(reply["token_strs"]) == "Hello world"
    assert post(server.url, "/tokenize", {"prompt": "Hello world"}).json()["token_strs"] is None
    messages = [{"role": "user", "content": "Hi"}]
    chat = post(server.url, "/tokenize", {"messages": messages}).json()["tokens"]
    assert chat == engine.chat_prompt_ids(messages)
    # add_special_tokens only adds the tokenizer's BOS; this model adds none, so nothing changes.
    assert post(server.url, "/tokenize", {"messages": messages, "add_special_tokens": True}).json()["tokens"] == chat
    assert post(server.url, "/tokenize", {"content": "Hello world"}).json()["tokens"] == reply["tokens"]  # llama.cpp


def test_detokenize_returns_the_prompt(server) -> None:
    ids = post(server.url, "/tokenize", {"prompt": "日本語 and 🎉"}).json()["tokens"]
    assert post(server.url, "/detokenize", {"tokens": ids}).json() == {"prompt": "日本語 and 🎉"}


def test_tokenizer_routes_check_the_model(server) -> None:
    assert_error(post(server.url, "/tokenize", {"prompt": "x", "model": "nope"}), 404, param="model")
    assert_error(post(server.url, "/detokenize", {"tokens": [1], "model": "nope"}), 404, param="model")
    named = {"prompt": "x", "model": server.state.served_model_name}
    assert post(server.url, "/tokenize", named).status_code == 200
