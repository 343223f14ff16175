"""Servers with other settings: an API key (401), a full queue (429), a request deadline
(504), /health while the model loads and after a load fails (503). One server at a time
around the shared engine; the loading ones load a model of their own."""

import concurrent.futures

import httpx
import openai
import pytest

from tests.helpers.http import ASCII_PROMPT, assert_error, chat_body, messages, parse_sse, post, wait_until
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"


def test_api_key_guards_every_route_but_health_and_metrics(engine) -> None:
    with live_server(engine, api_key="sekrit") as live:
        good = {"Authorization": "Bearer sekrit"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            for method, path in (("POST", CHAT), ("GET", "/v1/models"), ("GET", "/v1/server_info"),
                                 ("POST", "/tokenize"), ("POST", "/v1/embeddings")):
                response = httpx.request(method, live.url + path, headers=headers, json=chat_body("hi", max_tokens=1))
                assert_error(response, 401, param="authorization", code="invalid_api_key",
                             mentions=("API key",))
        assert httpx.get(live.url + "/health").json() == {"status": "ok"}
        assert httpx.get(live.url + "/metrics").status_code == 200
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1), headers=good).status_code == 200
        model = httpx.get(live.url + "/v1/models", headers=good).json()["data"][0]["id"]
        assert httpx.get(live.url + "/v1/server_info", headers=good).json()["server"]["api_key_required"] is True

        client = openai.OpenAI(base_url=live.url + "/v1", api_key="sekrit", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model=model, messages=messages("hi"), max_tokens=2, logprobs=True)
        assert len(reply.choices[0].logprobs.content) == reply.usage.completion_tokens
        wrong = openai.OpenAI(base_url=live.url + "/v1", api_key="nope", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model=model, messages=messages("hi"), max_tokens=2)
        scrape = httpx.get(live.url + "/metrics").text
        refused = [line for line in scrape.splitlines()
                   if line.startswith("batchproof_requests_total{") and 'status="401"' in line]
        assert refused and sum(float(line.split()[-1]) for line in refused) == 3 * 5 + 1


def test_full_queue_is_429_with_retry_after(engine) -> None:
    """While the engine prefills a long prompt, one request waits in the queue; the next is refused."""
    long_prompt = chat_body("hello " * 400, max_tokens=1)
    with live_server(engine, max_queue=1) as live, concurrent.futures.ThreadPoolExecutor(3) as pool:
        state = live.state
        first = pool.submit(post, live.url, CHAT, long_prompt)
        assert wait_until(lambda: state.backend.num_running == 1, timeout=10)
        second = pool.submit(post, live.url, CHAT, chat_body("hi", max_tokens=1))
        assert wait_until(lambda: state.backend.num_waiting == 1, timeout=10)
        refused = post(live.url, CHAT, chat_body("hi", max_tokens=1))
        refused_legacy = post(live.url, "/v1/completions", {"prompt": "hi", "max_tokens": 1})
        assert first.result().status_code == 200 and second.result().status_code == 200
        for response in (refused, refused_legacy):
            error = assert_error(response, 429, mentions=("max_queue=1",))
            assert error["type"] == "rate_limit_error"
            assert int(response.headers["Retry-After"]) >= 1
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200  # room again
        scrape = httpx.get(live.url + "/metrics").text
        assert 'batchproof_requests_total{route="/v1/chat/completions",status="429"} 1.0' in scrape


def test_request_deadline_is_504_and_frees_the_slot(engine) -> None:
    with live_server(engine, request_timeout_s=1.0) as live:
        state = live.state
        error = assert_error(post(live.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=200, ignore_eos=True)), 504,
                             mentions=("1 s",))
        assert error["type"] == "timeout_error"
        assert wait_until(lambda: state.backend.num_running == 0, timeout=3)

        response = httpx.post(live.url + CHAT, json=chat_body(ASCII_PROMPT, max_tokens=200, ignore_eos=True,
                                                              stream=True, logprobs=True), timeout=30)
        assert response.status_code == 200  # the stream had started; the error comes as an event
        events = parse_sse(response.text)
        assert "[DONE]" not in events
        assert set(events[-1]) == {"error"} and events[-1]["error"]["type"] == "timeout_error"
        assert all("choices" in e for e in events[:-1])
        assert wait_until(lambda: state.backend.num_running == 0, timeout=3)

        legacy = post(live.url, "/v1/completions", {"prompt": "hi", "max_tokens": 200, "ignore_eos": True})
        assert_error(legacy, 504, mentions=("1 s",))
        assert wait_until(lambda: state.backend.num_running == 0, timeout=3)
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200


def test_health_is_503_while_the_model_loads_then_200() -> None:
    """A fresh server that loads the model itself (a second copy, a few seconds)."""
    with live_server(None, wait_ready=False) as live:
        first = httpx.get(live.url + "/health")
        assert first.status_code == 503 and first.json() == {"status": "loading"}
        assert first.headers["Retry-After"] == "1"
        early = post(live.url, CHAT, chat_body("hi", max_tokens=1))
        if early.status_code != 200:  # still loading: a clear 503, never a 500
            error = assert_error(early, 503, mentions=("loading",))
            assert error["type"] == "service_unavailable" and early.headers["Retry-After"] == "1"
        statuses = []
        assert wait_until(lambda: statuses.append(httpx.get(live.url + "/health").status_code) or statuses[-1] == 200,
                          timeout=60, interval=0.1)
        assert set(statuses) <= {200, 503} and statuses[-1] == 200
        assert httpx.get(live.url + "/health").json() == {"status": "ok"}
        assert post(live.url, CHAT, chat_body("hi", max_tokens=1)).status_code == 200


@pytest.fixture
def broken_model(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file")
    return path


def test_a_model_that_fails_to_load_is_503_with_the_error(broken_model) -> None:
    with live_server(None, wait_ready=False, engine_settings={"model_path": broken_model}) as live:
        assert wait_until(lambda: httpx.get(live.url + "/health").json()["status"] == "failed", timeout=30)
        health = httpx.get(live.url + "/health")
        assert health.status_code == 503 and health.json() == {"status": "failed"}  # no file named to anyone
        error = assert_error(post(live.url, CHAT, chat_body("hi", max_tokens=1)), 503)
        assert "broken.gguf" in error["message"] and "not a GGUF file" in error["message"]


def test_routes_after_a_failed_load_say_it_failed(broken_model) -> None:
    with live_server(None, wait_ready=False, engine_settings={"model_path": broken_model}) as live:
        assert wait_until(lambda: httpx.get(live.url + "/health").json()["status"] == "failed", timeout=30)
        response = post(live.url, CHAT, chat_body("hi", max_tokens=1))
        error = assert_error(response, 503)
        assert "still loading" not in error["message"] and "broken.gguf" in error["message"]
