"""Legacy /v1/completions: string and token-id prompts, logprobs 0..5, echo and prompt
scoring (as lm-eval-harness uses it), text_offset, and streaming."""

import math

import openai
import pytest

from tests.helpers.http import assert_error, chunks, post, stream

COMPLETIONS = "/v1/completions"
PROMPT = "The capital of France is"


def _complete(server, **fields) -> dict:
    response = post(server.url, COMPLETIONS, {"prompt": PROMPT, "temperature": 0, **fields})
    assert response.status_code == 200, response.text
    return response.json()


def _tokenize(server, text: str) -> list[int]:
    return post(server.url, "/tokenize", {"prompt": text}).json()["tokens"]


def _check_offsets(text: str, logprobs: dict) -> None:
    """Every token whose text is whole characters sits in `text` at its text_offset."""
    offsets = logprobs["text_offset"]
    assert offsets == sorted(offsets) and len(offsets) == len(logprobs["tokens"])
    for token, offset in zip(logprobs["tokens"], offsets):
        if "\ufffd" not in token:
            assert text[offset:offset + len(token)] == token, (token, offset, text)


@pytest.fixture(scope="module")
def greedy(server) -> dict:
    return _complete(server, max_tokens=6, logprobs=3)


def test_string_prompt_with_logprobs(greedy) -> None:
    choice = greedy["choices"][0]
    logprobs = choice["logprobs"]
    assert greedy["object"] == "text_completion" and greedy["id"].startswith("cmpl-")
    assert choice["finish_reason"] == "length" and greedy["usage"]["completion_tokens"] == 6
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 6
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        assert logprob <= 0.0 and 1 <= len(top) <= 3
        values = list(top.values())
        assert values == sorted(values, reverse=True)
        assert top[token] == logprob == values[0]  # greedy: the chosen token is the best
    _check_offsets(choice["text"], logprobs)
    assert logprobs["text_offset"][0] == 0


def test_token_id_prompt_equals_the_string_prompt(server, greedy) -> None:
    ids = _tokenize(server, PROMPT)
    by_ids = _complete(server, prompt=ids, max_tokens=6, logprobs=3)
    assert by_ids["choices"] == greedy["choices"] and by_ids["usage"] == greedy["usage"]
    assert greedy["usage"]["prompt_tokens"] == len(ids)
    as_list = _complete(server, prompt=[PROMPT], max_tokens=6, logprobs=3)
    assert as_list["choices"] == greedy["choices"]


@pytest.mark.parametrize("n", [0, 1, 5])
def test_logprobs_zero_to_five(server, greedy, n) -> None:
    reply = _complete(server, max_tokens=6, logprobs=n)
    logprobs = reply["choices"][0]["logprobs"]
    assert reply["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert logprobs["token_logprobs"] == greedy["choices"][0]["logprobs"]["token_logprobs"]
    assert all(len(top) <= n for top in logprobs["top_logprobs"])
    if n == 0:
        assert logprobs["top_logprobs"] == [{}] * 6
    else:
        assert any(len(top) == n for top in logprobs["top_logprobs"])


def test_logprobs_absent_gives_null_and_the_same_text(server, greedy) -> None:
    reply = _complete(server, max_tokens=6)
    assert reply["choices"][0]["logprobs"] is None
    assert reply["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert reply["usage"] == greedy["usage"]


@pytest.mark.parametrize("bad", [-1, 2.5, "3", True])
def test_logprobs_not_a_count_is_422(server, bad) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 1, "logprobs": bad})
    assert_error(response, 422, param="logprobs", mentions=("logprobs", repr(bad)))


def test_logprobs_above_the_cap_is_400_naming_it(server) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 1, "logprobs": 21})
    assert_error(response, 400, param="logprobs", mentions=("'logprobs' is 21", "--max-logprobs 20"))


def test_echo_scoring_the_prompt(server) -> None:
    """max_tokens 0 with echo: the prompt's tokens scored; the first has null logprob and top."""
    ids = _tokenize(server, PROMPT)
    reply = _complete(server, max_tokens=0, echo=True, logprobs=2)
    choice = reply["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    usage = reply["usage"]
    assert usage.pop("prompt_tokens_details")["cached_tokens"] in range(len(ids))  # earlier tests share its prefix
    assert usage == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}
    assert "".join(logprobs["tokens"]) == PROMPT and len(logprobs["tokens"]) == len(ids)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for logprob, top in zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:]):
        assert logprob <= 0.0 and len(top) == 2
        assert logprob <= max(top.values())
    _check_offsets(choice["text"], logprobs)


def test_echo_scoring_a_single_token_prompt(server) -> None:
    ids = _tokenize(server, "The")
    assert len(ids) == 1
    reply = _complete(server, prompt=ids, max_tokens=0, echo=True, logprobs=2)
    assert reply["choices"][0]["text"] == "The"
    assert reply["choices"][0]["logprobs"] == {"tokens": ["The"], "token_logprobs": [None], "top_logprobs": [None],
                                               "text_offset": [0]}


def test_echo_scores_equal_the_generated_logprobs(server, greedy) -> None:
    """Two routes, one answer: score P + C (C the greedy continuation of P) with echo, and
    the scores of C's tokens equal the logprobs C was generated with."""
    continuation = greedy["choices"][0]["logprobs"]
    ids = _tokenize(server, PROMPT)
    generated_ids = [_tokenize(server, t)[0] for t in continuation["tokens"]]  # single tokens, ASCII
    assert [post(server.url, "/detokenize", {"tokens": [i]}).json()["prompt"] for i in generated_ids] == \
        continuation["tokens"]
    scored = _complete(server, prompt=ids + generated_ids, max_tokens=0, echo=True, logprobs=3)
    scores = scored["choices"][0]["logprobs"]
    n = len(generated_ids)
    assert scores["tokens"][-n:] == continuation["tokens"]
    assert scores["token_logprobs"][-n:] == pytest.approx(continuation["token_logprobs"], abs=1e-4)
    for scored_top, generated_top in zip(scores["top_logprobs"][-n:], continuation["top_logprobs"]):
        assert list(scored_top) == list(generated_top)
        assert list(scored_top.values()) == pytest.approx(list(generated_top.values()), abs=1e-4)


def test_echo_with_generation(server, greedy) -> None:
    reply = _complete(server, max_tokens=6, echo=True, logprobs=3)
    choice = reply["choices"][0]
    logprobs = choice["logprobs"]
    plain = greedy["choices"][0]
    n_prompt = len(_tokenize(server, PROMPT))
    assert choice["text"] == PROMPT + plain["text"]
    assert logprobs["tokens"][n_prompt:] == plain["logprobs"]["tokens"]
    assert logprobs["token_logprobs"][n_prompt:] == plain["logprobs"]["token_logprobs"]
    assert logprobs["top_logprobs"][n_prompt:] == plain["logprobs"]["top_logprobs"]
    assert logprobs["token_logprobs"][0] is None
    assert all(v is not None for v in logprobs["token_logprobs"][1:])
    _check_offsets(choice["text"], logprobs)
    without_logprobs = _complete(server, max_tokens=6, echo=True)["choices"][0]
    assert without_logprobs["text"] == choice["text"] and without_logprobs["logprobs"] is None


def test_max_tokens_zero_needs_echo(server) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 0})
    assert_error(response, 400, param="max_tokens", mentions=("max_tokens", "0", "echo"))


def test_streamed_completion_equals_unstreamed(server) -> None:
    body = {"prompt": PROMPT, "temperature": 0, "max_tokens": 6, "logprobs": 2,
            "stream_options": {"include_usage": True}}
    whole = _complete(server, **{k: v for k, v in body.items() if k != "stream_options"})
    _, _, events = stream(server.url, COMPLETIONS, body)
    body_chunks = chunks(events)
    text, merged = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in body_chunks[:-1]:
        (choice,) = chunk["choices"]
        assert chunk["object"] == "text_completion" and chunk["id"] == body_chunks[0]["id"]
        assert choice["text"] or choice["finish_reason"]
        text += choice["text"]
        for key in merged:
            merged[key] += choice["logprobs"][key]
    assert body_chunks[-1]["choices"] == [] and body_chunks[-1]["usage"] == whole["usage"]
    assert text == whole["choices"][0]["text"]
    assert merged == whole["choices"][0]["logprobs"]
    assert body_chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_streamed_completion_without_logprobs(server) -> None:
    _, _, events = stream(server.url, COMPLETIONS, {"prompt": PROMPT, "temperature": 0, "max_tokens": 4})
    body_chunks = chunks(events)
    assert all(c["choices"][0]["logprobs"] is None for c in body_chunks)
    whole = _complete(server, max_tokens=4)
    assert "".join(c["choices"][0]["text"] for c in body_chunks) == whole["choices"][0]["text"]


def test_echo_with_stream_is_refused(server) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 2, "echo": True, "stream": True})
    assert_error(response, 400, param="echo", mentions=("echo", "stream"))


@pytest.mark.parametrize("prompt, param", [([], "prompt"), ([10 ** 9], "prompt"), ([-1], "prompt"), ([[]], "prompt"),
                                           ([[1], [-1]], "prompt"), (["a", ""], "prompt"), ([[1], "a"], "prompt"),
                                           ([1, [2]], "prompt"), (None, "prompt")])
def test_bad_prompts_are_400(server, prompt, param) -> None:
    response = post(server.url, COMPLETIONS, {"prompt": prompt, "max_tokens": 1})
    assert_error(response, 400, param=param, mentions=("prompt",))


def test_openai_client_legacy_completion(server, greedy) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = client.completions.create(model=server.state.served_model_name, prompt=PROMPT, temperature=0,
                                      max_tokens=6, logprobs=3)
    assert reply.choices[0].text == greedy["choices"][0]["text"]
    assert reply.choices[0].logprobs.token_logprobs == greedy["choices"][0]["logprobs"]["token_logprobs"]
    assert reply.choices[0].logprobs.text_offset == greedy["choices"][0]["logprobs"]["text_offset"]
    assert all(math.isfinite(v) for v in reply.choices[0].logprobs.token_logprobs)


CJK = "日本語 is"


def test_text_offset_indexes_the_text_after_a_split_character(server) -> None:
    reply = _complete(server, prompt=CJK, max_tokens=4, echo=True, logprobs=1)
    choice = reply["choices"][0]
    assert choice["text"].startswith(CJK)
    _check_offsets(choice["text"], choice["logprobs"])


def test_streamed_text_offset_equals_unstreamed_after_a_split_character(server) -> None:
    body = {"prompt": "The word is: 日本語. Again: 日本", "temperature": 0, "max_tokens": 6, "logprobs": 1}
    whole = _complete(server, **body)["choices"][0]
    assert "\ufffd" in "".join(whole["logprobs"]["tokens"])  # the reply has characters split over tokens
    _, _, events = stream(server.url, COMPLETIONS, body)
    offsets = [o for c in chunks(events) for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == whole["logprobs"]["text_offset"]
