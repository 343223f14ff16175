"""/v1/completions with several prompts and n choices: one request of N prompts answers bitwise
as N requests of one (greedy and seeded sampling, streamed or not); n choices per prompt."""

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.helpers.http import chunks, post, stream

COMPLETIONS = "/v1/completions"
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "def add(a, b):"]


def _complete(server, **fields) -> dict:
    response = post(server.url, COMPLETIONS, fields, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def _without_index(choice: dict) -> dict:
    return {k: v for k, v in choice.items() if k != "index"}


def _ids(server, text: str) -> list[int]:
    return post(server.url, "/tokenize", {"prompt": text}).json()["tokens"]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"])
def test_a_list_of_prompts_answers_as_each_alone(server, sampling) -> None:
    fields = {"max_tokens": 8, "logprobs": 3, "echo": True, **sampling}
    together = _complete(server, prompt=PROMPTS, **fields)
    assert [c["index"] for c in together["choices"]] == list(range(len(PROMPTS)))
    alone = [_complete(server, prompt=p, **fields) for p in PROMPTS]
    assert [_without_index(c) for c in together["choices"]] == [_without_index(a["choices"][0]) for a in alone]
    usage = together["usage"]
    assert usage["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert usage["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_every_prompt_shape_gives_the_same_choices(server) -> None:
    fields = {"max_tokens": 5, "logprobs": 2, "temperature": 0}
    ids = [_ids(server, p) for p in PROMPTS[:2]]
    as_text = _complete(server, prompt=PROMPTS[:2], **fields)["choices"]
    as_ids = _complete(server, prompt=ids, **fields)["choices"]
    assert as_ids == as_text
    assert _complete(server, prompt=ids[0], **fields)["choices"] == as_text[:1]


def test_token_id_prompts_are_used_as_given(server) -> None:
    """No BOS is added: echoed entries line up one to one with the ids sent."""
    ids = [_ids(server, "Hello there"), [1] + _ids(server, "Hi")]  # the second starts with a special token
    reply = _complete(server, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    for choice, sent in zip(reply["choices"], ids):
        assert len(choice["logprobs"]["tokens"]) == len(sent)
    assert reply["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_vllm_online_batch_invariance_shape(server) -> None:
    """vLLM's test: 32 prompts, one by one and as one list prompt, sampled at temperature 0.6
    with seed 42 and logprobs 5: bitwise-equal tokens and logprobs."""
    prompts = [f"Story {i}: the {['cat', 'ship', 'river', 'robot'][i % 4]} went" for i in range(32)]
    fields = {"max_tokens": 4, "temperature": 0.6, "seed": 42, "logprobs": 5}
    together = _complete(server, prompt=prompts, **fields)["choices"]
    with ThreadPoolExecutor(8) as pool:  # one by one, concurrently, as vLLM's test sends them
        alone = list(pool.map(lambda p: _complete(server, prompt=p, **fields)["choices"][0], prompts))
    for mine, single in zip(together, alone):
        assert mine["text"] == single["text"]
        assert mine["logprobs"]["tokens"] == single["logprobs"]["tokens"]
        assert mine["logprobs"]["token_logprobs"] == single["logprobs"]["token_logprobs"]  # ==, not approx
        assert mine["logprobs"]["top_logprobs"] == single["logprobs"]["top_logprobs"]


def test_streamed_prompts_equal_unstreamed(server) -> None:
    fields = {"prompt": PROMPTS[:3], "max_tokens": 6, "logprobs": 2, "temperature": 0.7, "seed": 3, "n": 2,
              "stream_options": {"include_usage": True}}
    whole = _complete(server, **{k: v for k, v in fields.items() if k != "stream_options"})
    _, _, events = stream(server.url, COMPLETIONS, fields)
    body = chunks(events)
    texts: dict[int, str] = {}
    logprobs: dict[int, dict] = {}
    finish: dict[int, str] = {}
    for chunk in body[:-1]:
        (choice,) = chunk["choices"]
        i = choice["index"]
        texts[i] = texts.get(i, "") + choice["text"]
        merged = logprobs.setdefault(i, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []})
        for key in merged:
            merged[key] += choice["logprobs"][key]
        if choice["finish_reason"] is not None:
            assert i not in finish
            finish[i] = choice["finish_reason"]
    assert sorted(texts) == list(range(6))
    for choice in whole["choices"]:
        i = choice["index"]
        assert (texts[i], logprobs[i], finish[i]) == (choice["text"], choice["logprobs"], choice["finish_reason"])
    assert body[-1]["choices"] == [] and body[-1]["usage"] == whole["usage"]


def test_n_greedy_choices_are_identical(server) -> None:
    reply = _complete(server, prompt=PROMPTS[0], n=3, max_tokens=6, logprobs=2, temperature=0)
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert _without_index(choices[0]) == _without_index(choices[1]) == _without_index(choices[2])
    assert reply["usage"]["completion_tokens"] == 3 * 6
    assert reply["usage"]["prompt_tokens"] == len(_ids(server, PROMPTS[0]))  # the prompt counts once


def test_n_seeded_choices_each_have_their_own_generator(server) -> None:
    """Choice j runs with seed + j: choice 0 is the request alone; choice 1 is seed + 1 alone."""
    fields = {"prompt": PROMPTS[1], "max_tokens": 12, "temperature": 1.0, "logprobs": 1}
    three = _complete(server, n=3, seed=11, **fields)["choices"]
    assert _without_index(three[0]) == _without_index(_complete(server, seed=11, **fields)["choices"][0])
    assert _without_index(three[1]) == _without_index(_complete(server, seed=12, **fields)["choices"][0])
    assert len({c["text"] for c in three}) > 1  # different generators draw different tokens


def test_n_on_chat(server) -> None:
    body = {"messages": [{"role": "user", "content": "Pick a color."}], "max_tokens": 6, "n": 2,
            "temperature": 0.9, "seed": 5, "logprobs": True, "top_logprobs": 2}
    reply = post(server.url, "/v1/chat/completions", body).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        entries = choice["logprobs"]["content"]
        assert entries and all(len(e["top_logprobs"]) == 2 for e in entries)
        assert "".join(bytes(e["bytes"]).decode("utf-8", "replace") for e in entries) == choice["message"]["content"]
    assert reply["usage"]["completion_tokens"] == sum(len(c["logprobs"]["content"]) for c in reply["choices"])
    alone = post(server.url, "/v1/chat/completions", {**body, "n": 1}).json()["choices"][0]
    assert alone == reply["choices"][0]
    _, _, events = stream(server.url, "/v1/chat/completions", body)
    roles = [c["choices"][0]["index"] for c in chunks(events) if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]


def test_more_than_four_stop_strings_on_completions(server) -> None:
    stops = ["\n\n", "Question:", "</s>", "<|im_end|>", "Answer:", "###", " city"]
    reply = _complete(server, prompt="The capital of France is Paris, a", stop=stops, max_tokens=20, temperature=0)
    assert all(s not in reply["choices"][0]["text"] for s in stops)
    too_many = post(server.url, COMPLETIONS, {"prompt": "x", "max_tokens": 1, "stop": [str(i) for i in range(65)]})
    assert too_many.status_code == 400 and "64" in too_many.json()["error"]["message"]
    chat = post(server.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "max_tokens": 1, "stop": stops})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "stop"


def test_too_many_sequences_is_400(server) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": ["a"] * 20, "n": 16, "max_tokens": 1})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "prompt" and "320" in error["message"]


def test_openai_client_list_prompt_n_and_extensions(server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.completions.create(model=server.state.served_model_name, prompt=PROMPTS[:2], n=3, max_tokens=4,
                                      temperature=0.7, seed=1, logprobs=2,
                                      extra_body={"prompt_logprobs": 2, "logprobs_mode": "processed"})
    assert [c.index for c in reply.choices] == list(range(6))
    raw = json.loads(reply.model_dump_json())
    for choice in raw["choices"]:
        prompt_len = len(_ids(server, PROMPTS[choice["index"] // 3]))
        assert len(choice["prompt_logprobs"]) == prompt_len and choice["prompt_logprobs"][0] is None
        assert all(2 <= len(entry) <= 3 for entry in choice["prompt_logprobs"][1:])
        assert len(choice["logprobs"]["token_logprobs"]) == 4
    with pytest.raises(openai.BadRequestError) as refused:  # a named tool_choice that names no offered tool
        client.chat.completions.create(model=server.state.served_model_name, max_tokens=1,
                                       messages=[{"role": "user", "content": "hi"}],
                                       tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
                                       tool_choice={"type": "function", "function": {"name": "g"}})
    assert "'g'" in refused.value.message
