"""The prefix cache as a client sees it: `usage.prompt_tokens_details.cached_tokens` on both
routes, streamed or not (read by the official openai client too), the same reply bits
with and without hits, hit and miss counters and bytes on /metrics, the budget and block
size in /v1/server_info, and `--no-prefix-cache`."""

import re

import httpx
import openai
import pytest

from batchproof.engine.model.ops import kernels
from tests.helpers.http import chunks, post, stream

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the cache needs our kernels")

SYSTEM = "You answer in one short sentence, as a ship's navigator would, with a bearing where you can. " * 4
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat_request(question: str, **extra) -> dict:
    return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "temperature": 0, "max_tokens": 6, "logprobs": True, "top_logprobs": 2, **extra}


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not on /metrics"
    return float(match.group(1))


def test_chat_replies_say_how_many_prompt_tokens_the_cache_served(server):
    first = post(server.url, CHAT, chat_request("Where is north?")).json()
    second = post(server.url, CHAT, chat_request("Where is north?")).json()
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= prompt_tokens - 16
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] < prompt_tokens  # the last token is computed
    assert second["choices"] == first["choices"]  # every logprob and alternative, bit for bit

    _, _, events = stream(server.url, CHAT, chat_request("Where is south?", stream_options={"include_usage": True}))
    streamed = chunks(events)
    assert streamed[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * (len(SYSTEM) // 100)


def test_the_openai_client_reads_cached_tokens_on_both_routes(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    prompt = "The navigator plotted a course past the lighthouse, the reef and the northern cape, then " * 3
    model = server.state.served_model_name
    replies = [client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
               for _ in range(2)]
    assert replies[1].usage.prompt_tokens_details.cached_tokens > 0
    assert replies[1].choices[0].logprobs == replies[0].choices[0].logprobs
    _, _, events = stream(server.url, COMPLETIONS, {"prompt": prompt, "max_tokens": 4, "temperature": 0,
                                                    "stream_options": {"include_usage": True}})
    assert chunks(events)[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_metrics_count_hits_and_misses_and_server_info_names_the_budget(server):
    info = server.state.client.info()["prefix_cache"]
    doc = httpx.get(server.url + "/v1/server_info", timeout=30).json()["prefix_cache"]
    assert doc["enabled"] is True and doc["block_size"] == info["block_size"] == 16
    assert doc["budget_bytes"] == 128 * 2**20
    text = httpx.get(server.url + "/metrics", timeout=30).text
    queries, hits = metric(text, "batchproof_prefix_cache_queries_total"), metric(text,
                                                                                 "batchproof_prefix_cache_hits_total")
    post(server.url, CHAT, chat_request("Where is east?"))
    text = httpx.get(server.url + "/metrics", timeout=30).text
    assert metric(text, "batchproof_prefix_cache_queries_total") > queries
    assert metric(text, "batchproof_prefix_cache_hits_total") > hits
    assert metric(text, "batchproof_prefix_cache_misses_total") >= 1
    assert 0 < metric(text, "batchproof_prefix_cache_bytes") <= metric(text, "batchproof_prefix_cache_budget_bytes")


def test_the_serve_flags_turn_it_off_and_size_it():
    import argparse

    from batchproof.commands import serve
    from batchproof.commands.flags import dataclass_from_args
    from batchproof.engine.config import EngineConfig

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert dataclass_from_args(EngineConfig, parser.parse_args([])).prefix_cache is True
    off = dataclass_from_args(EngineConfig, parser.parse_args(["--no-prefix-cache", "--prefix-cache-mb", "64"]))
    assert off.prefix_cache is False and off.prefix_cache_mb == 64
