"""The cap on alternatives per token (--max-logprobs, default 20) is inclusive: 20 is served,
21 is a 400 naming the field and the value asked for."""

from tests.helpers.http import assert_error, chat_body, post

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CAP = 20


def test_top_logprobs_at_the_cap_is_served_on_chat(server):
    reply = post(server.url, CHAT, chat_body("Name a colour.", max_tokens=2, logprobs=True, top_logprobs=CAP))
    assert reply.status_code == 200, reply.text
    entries = reply.json()["choices"][0]["logprobs"]["content"]
    assert entries and all(len(entry["top_logprobs"]) == CAP for entry in entries)


def test_prompt_logprobs_past_the_cap_is_refused_on_completions(server):
    body = {"prompt": "The sea is", "max_tokens": 1, "temperature": 0}
    error = assert_error(post(server.url, COMPLETIONS, {**body, "prompt_logprobs": CAP + 1}), 400,
                         param="prompt_logprobs", mentions=("prompt_logprobs", str(CAP + 1)))
    assert f"at most {CAP}" in error["message"]
    served = post(server.url, COMPLETIONS, {**body, "prompt_logprobs": CAP})
    assert served.status_code == 200, served.text
    scored = served.json()["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and all(len(entry) >= CAP for entry in scored[1:])
