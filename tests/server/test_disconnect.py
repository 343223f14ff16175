"""A client that hangs up (mid-stream, or by timing out on an unstreamed request) aborts its
request in the engine: the slot frees, the batch ends in the log, and the next request works."""

import httpx
import openai
import pytest

from tests.helpers.http import ASCII_PROMPT, chat_body, messages, parse_sse, post, streamed_chat, wait_until

CHAT = "/v1/chat/completions"
LONG = 400  # tokens the aborted requests would have run to (~20 s): far more than the test waits


def _log_lines(server) -> int:
    return len(server.log_file.read_text().splitlines()) if server.log_file.exists() else 0


def _completion_tokens(server) -> float:
    return server.state.metrics.registry.get_sample_value("batchproof_completion_tokens_total")


def _check_aborted_and_recovered(server, lines_before: int, tokens_before: float) -> None:
    state = server.state
    assert wait_until(lambda: state.backend.num_running == 0 and state.backend.num_waiting == 0,
                      timeout=2.5), "the request kept its batch slot after the client left"
    assert wait_until(lambda: _log_lines(server) > lines_before, timeout=2.5), "no batch log line"
    assert _completion_tokens(server) - tokens_before < LONG / 4  # it stopped long before max_tokens
    reply = post(server.url, CHAT, chat_body("hi", max_tokens=2, logprobs=True)).json()
    assert reply["choices"][0]["finish_reason"] == "length"
    assert len(reply["choices"][0]["logprobs"]["content"]) == 2


def _wait_idle(server) -> None:
    assert wait_until(lambda: server.state.backend.num_running == 0, timeout=5)


def test_stream_disconnect_aborts_the_request(server) -> None:
    _wait_idle(server)
    lines, tokens = _log_lines(server), _completion_tokens(server)
    body = chat_body(ASCII_PROMPT, max_tokens=LONG, ignore_eos=True, stream=True, logprobs=True)
    with httpx.stream("POST", server.url + CHAT, json=body, timeout=30) as response:
        assert response.status_code == 200
        received = 0
        for line in response.iter_lines():
            received += line.startswith("data: ")
            if received == 3:
                break
    assert server.state.backend.num_running in (0, 1)
    _check_aborted_and_recovered(server, lines, tokens)


def test_openai_client_that_stops_reading_aborts_the_request(server) -> None:
    _wait_idle(server)
    lines, tokens = _log_lines(server), _completion_tokens(server)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    stream = client.chat.completions.create(model=server.state.served_model_name, messages=messages(ASCII_PROMPT),
                                            max_tokens=LONG, extra_body={"ignore_eos": True}, stream=True)
    pieces = []
    for chunk in stream:
        pieces.append(chunk.choices[0].delta.content)
        if len(pieces) == 4:
            break
    stream.close()
    assert pieces[0] == ""
    _check_aborted_and_recovered(server, lines, tokens)


def test_unstreamed_client_timeout_aborts_the_request(server) -> None:
    _wait_idle(server)
    lines, tokens = _log_lines(server), _completion_tokens(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + CHAT, json=chat_body(ASCII_PROMPT, max_tokens=LONG, ignore_eos=True), timeout=0.6)
    _check_aborted_and_recovered(server, lines, tokens)


def test_legacy_stream_disconnect_aborts_the_request(server) -> None:
    _wait_idle(server)
    lines, tokens = _log_lines(server), _completion_tokens(server)
    body = {"prompt": ASCII_PROMPT, "max_tokens": LONG, "ignore_eos": True, "stream": True, "logprobs": 1}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    _check_aborted_and_recovered(server, lines, tokens)


def test_one_client_leaving_does_not_disturb_another(server) -> None:
    """Greedy replies are batch invariant: the survivor's reply equals the one it gets alone."""
    _wait_idle(server)
    body = chat_body(ASCII_PROMPT, max_tokens=8, logprobs=True, top_logprobs=2)
    alone = post(server.url, CHAT, body).json()["choices"][0]
    leaver = chat_body("Count to one hundred.", max_tokens=LONG, ignore_eos=True, stream=True)
    with httpx.stream("POST", server.url + CHAT, json=leaver, timeout=30) as gone:
        next(gone.iter_lines())
        with httpx.stream("POST", server.url + CHAT, json={**body, "stream": True}, timeout=30) as stay:
            raw = "".join(stay.iter_text())
    # The leaver's client closed only after the survivor finished; wait for its abort.
    _wait_idle(server)
    content, entries, finish = streamed_chat(parse_sse(raw))
    assert (content, entries, finish) == (alone["message"]["content"], alone["logprobs"]["content"], "length")
