"""The small routes: /v1/models, /health, /metrics, /tokenize, /detokenize, /v1/server_info
and /openapi.json, each checked against the engine or another route."""

import concurrent.futures
import re
import socket
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import batchproof
from tests.helpers.http import ASCII_PROMPT, CJK_PROMPT, EMOJI_PROMPT, chat_body, messages, post, wait_until

MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT = "/v1/chat/completions"
HANG_GUARD_S = 60


def test_models_lists_the_served_model(server) -> None:
    body = httpx.get(server.url + "/v1/models").json()
    assert body["object"] == "list" and len(body["data"]) == 1
    (model,) = body["data"]
    assert model["id"] == server.state.served_model_name == MODEL_FILE.removesuffix(".gguf")
    assert model["object"] == "model" and model["owned_by"] == "batchproof"
    assert model["max_model_len"] == server.state.front.max_model_len
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [model["id"]]


def test_health_is_ok(server) -> None:
    response = httpx.get(server.url + "/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def _scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_tokens_and_latencies(server) -> None:
    response = httpx.get(server.url + "/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    assert wait_until(lambda: server.state.backend.num_running == 0)
    before = _scrape(server)
    reply = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=5)).json()
    refused = post(server.url, CHAT, chat_body(ASCII_PROMPT, max_tokens=0))
    missing = httpx.get(server.url + "/no/such/route")
    assert refused.status_code == 400 and missing.status_code == 404
    # The batch is logged (and its size observed) when the engine goes idle, just after the reply.
    assert wait_until(lambda: _value(_scrape(server), "batchproof_batch_size_count")
                      == _value(before, "batchproof_batch_size_count") + 1)
    after = _scrape(server)

    def grew(name: str, **labels) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    route = "/v1/chat/completions"
    assert grew("batchproof_requests_total", route=route, status="200") == 1
    assert grew("batchproof_requests_total", route=route, status="400") == 1
    assert grew("batchproof_requests_total", route="unmatched", status="404") == 1
    assert grew("batchproof_prompt_tokens_total") == reply["usage"]["prompt_tokens"]
    assert grew("batchproof_completion_tokens_total") == reply["usage"]["completion_tokens"] == 5
    assert grew("batchproof_time_to_first_token_seconds_count") == 1
    assert grew("batchproof_time_per_output_token_seconds_count") == 4
    assert 0 < grew("batchproof_time_to_first_token_seconds_sum") < 30
    assert grew("batchproof_batch_size_bucket", le="1.0") == 1
    assert grew("batchproof_batch_size_sum") == 1
    assert _value(after, "batchproof_queue_depth") == 0
    assert ("batchproof_running_requests", ()) in after
    assert grew("batchproof_requests_total", route="/metrics", status="200") >= 1


def test_metrics_batch_size_sees_requests_decoded_together(server, monkeypatch) -> None:
    backend = server.state.backend
    assert wait_until(lambda: backend.num_running == 0)
    # Whether three requests sent at once meet in one batch is the machine's timing: the first
    # is admitted only once the other two are queued behind it, so the engine takes all three
    # before its first step, prefills them together and decodes them together.
    add_request, all_queued = backend.engine.add_request, threading.Event()

    def add_once_all_are_queued(*args, **kwargs):
        if not all_queued.is_set():
            assert wait_until(lambda: backend.num_waiting >= 2, timeout=HANG_GUARD_S)
            all_queued.set()
        return add_request(*args, **kwargs)

    monkeypatch.setattr(backend.engine, "add_request", add_once_all_are_queued)
    before = _scrape(server)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda _: post(server.url, CHAT, chat_body("hi", max_tokens=8, ignore_eos=True)),
                                range(3)))
    assert all(r.status_code == 200 for r in replies)
    assert wait_until(lambda: server.state.backend.num_running == 0)
    assert wait_until(lambda: _value(_scrape(server), "batchproof_batch_size_count")
                      > _value(before, "batchproof_batch_size_count"))
    after = _scrape(server)
    new_sum = _value(after, "batchproof_batch_size_sum") - _value(before, "batchproof_batch_size_sum")
    new_count = _value(after, "batchproof_batch_size_count") - _value(before, "batchproof_batch_size_count")
    assert (new_count, new_sum) == (1, 3)  # one batch, of all three
    lines = server.log_file.read_text().splitlines()
    assert any(re.search(r"batch m=3 done in \d+ms", line) for line in lines)


@pytest.mark.parametrize("text", ["Hello, world!", "日本語 and 🎉", " leading space\nnew line",
                                  "<|im_start|>user"])
def test_tokenize_prompt_equals_the_engine_and_round_trips(server, text) -> None:
    engine = server.state.backend.engine
    body = post(server.url, "/tokenize", {"prompt": text}).json()
    assert body["tokens"] == engine.tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == engine.max_model_len
    assert post(server.url, "/tokenize", {"content": text}).json() == body  # llama.cpp's name
    assert post(server.url, "/detokenize", {"tokens": body["tokens"]}).json() == {"prompt": text}


@pytest.mark.parametrize("content", [ASCII_PROMPT, CJK_PROMPT, EMOJI_PROMPT])
def test_tokenize_messages_equals_the_chat_prompt(server, content) -> None:
    engine = server.state.backend.engine
    body = post(server.url, "/tokenize", {"messages": messages(content)}).json()
    assert body["tokens"] == engine.chat_prompt_ids(messages(content))
    reply = post(server.url, CHAT, chat_body(content, max_tokens=1)).json()
    assert body["count"] == reply["usage"]["prompt_tokens"]
    bare = post(server.url, "/tokenize", {"messages": messages(content), "add_generation_prompt": False}).json()
    assert body["tokens"][:bare["count"]] == bare["tokens"] and bare["count"] < body["count"]
    text = post(server.url, "/detokenize", {"tokens": body["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\n") and content in text


def test_tokenize_messages_with_a_developer_message_equals_the_chat_prompt(server) -> None:
    chat_messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    counted = post(server.url, "/tokenize", {"messages": chat_messages}).json()["count"]
    reply = post(server.url, CHAT, {"messages": chat_messages, "max_tokens": 1}).json()
    assert counted == reply["usage"]["prompt_tokens"]


def test_detokenize_special_and_byte_tokens(server) -> None:
    tokenizer = server.state.backend.engine.tokenizer
    eos = tokenizer.ids.eos_id
    assert post(server.url, "/detokenize", {"tokens": [eos]}).json()["prompt"] == tokenizer.spelling(eos)
    halves = post(server.url, "/tokenize", {"prompt": "🎉"}).json()["tokens"]
    assert len(halves) > 1  # the emoji spans several tokens; each alone is not valid UTF-8
    assert post(server.url, "/detokenize", {"tokens": halves[:1]}).json()["prompt"].endswith("\ufffd")
    assert post(server.url, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


def test_server_info_reports_what_shapes_the_numbers(server) -> None:
    info = httpx.get(server.url + "/v1/server_info").json()
    engine = server.state.backend.engine
    assert info["name"] == "batchproof" and info["version"] == batchproof.__version__
    assert re.fullmatch(r"[0-9a-f]{64}", info["build_sha256"])
    assert info["host"] == socket.gethostname()
    assert info["model_path"].endswith(MODEL_FILE) and info["model_path"] == str(engine.model_path)
    assert info["model_sha256"] == MODEL_SHA256
    assert info["served_model_name"] == httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    expected = {"device": "cpu", "dtype": "float32", "max_batch": 16, "batch_window_ms": 20.0,
                "batch_invariant": True, "max_model_len": engine.max_model_len, "architecture": "llama",
                "max_prefill_tokens": engine.config.max_prefill_tokens, "num_threads": engine.num_threads,
                "weights": "native"}
    assert {k: info[k] for k in expected} == expected
    # the default model's weights held in their blocks: 97 MB, not 538 MB of float32
    assert 90e6 < info["weights_bytes"] < 110e6
    assert info["server"] == {"max_queue": server.state.config.max_queue,
                              "request_timeout_s": server.state.config.request_timeout_s,
                              "api_key_required": False, "logprobs_mode": "raw", "max_logprobs": 20,
                              "max_logprob_entries": server.state.config.max_logprob_entries,
                              "max_logit_bias": 1024, "max_request_mb": 8.0, "prefix_cache_scope": "shared",
                              "receipts": "on_request"}
    assert info["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}", info["git_commit"])
    assert httpx.get(server.url + "/v1/server_info").json() == info  # stable between calls


def test_openapi_document_has_the_request_bodies(server) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    assert schema == server.app.openapi()
    components = schema["components"]["schemas"]
    for path, model in (("/v1/chat/completions", "ChatCompletionRequest"), ("/v1/completions", "CompletionRequest"),
                        ("/tokenize", "TokenizeRequest"), ("/detokenize", "DetokenizeRequest")):
        body = schema["paths"][path]["post"]["requestBody"]
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}
        assert components[model]["type"] == "object"
    chat = components["ChatCompletionRequest"]
    assert chat["required"] == ["messages"]
    top = [s for s in chat["properties"]["top_logprobs"]["anyOf"] if s.get("type") == "integer"]
    assert top == [{"type": "integer", "minimum": 0}]  # the upper bound is the server's --max-logprobs
    assert "/v1/embeddings" not in schema["paths"]
