"""Speculative decoding as a client sees it: through the official openai client, a copying
request's reply (tokens, logprobs, top-20 alternatives, streamed or not) is bit for bit the one
a server without speculation gives, 16 at once as alone; /metrics counts drafted and accepted
tokens, the server log names each request's counts, /v1/server_info says it is on, and
`--no-speculative` turns it off."""

import concurrent.futures
import re

import httpx
import openai
import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.ops import kernels
from tests.helpers.live_server import live_server

pytestmark = pytest.mark.skipif(not kernels.available(), reason="speculation needs our kernels")

PASSAGE = ("The lighthouse stood on a rock at the mouth of the bay. Every night the keeper climbed the "
           "ninety steps, trimmed the wick and wound the clockwork that turned the lens.")


@pytest.fixture(scope="module")
def plain_server():
    with live_server(Engine(EngineConfig(device="cpu", speculative=False, prefix_cache=False))) as live:
        yield live


def client(live) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(live, i: int, stream: bool = False) -> tuple:
    """A copying request (greedy for even i, seeded with seed 1 for odd) -> its text and every logprob float."""
    request = dict(model=live.state.served_model_name, max_tokens=40, logprobs=True, top_logprobs=20,
                   messages=[{"role": "user", "content": f"Repeat exactly: {PASSAGE}"}],
                   temperature=0.7 if i % 2 else 0.0, seed=i % 2)
    if not stream:
        choice = client(live).chat.completions.create(**request).choices[0]
        entries = choice.logprobs.content
        return choice.message.content, [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                                        for e in entries]
    text, entries = "", []
    for chunk in client(live).chat.completions.create(**request, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            entries += [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                        for e in chunk.choices[0].logprobs.content]
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text, entries


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not on /metrics"
    return float(match.group(1))


def test_replies_are_bitwise_a_plain_servers_alone_and_16_at_once(server, plain_server):
    before = metric(httpx.get(server.url + "/metrics").text, "batchproof_speculative_accepted_tokens_total")
    expected = [ask(plain_server, i) for i in range(2)]
    assert ask(server, 0) == expected[0]
    assert ask(server, 1) == expected[1]
    assert ask(server, 0, stream=True) == expected[0]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda i: ask(server, i, stream=bool(i % 3 == 0)), range(16)))
    assert together == [expected[i % 2] for i in range(16)]
    metrics = httpx.get(server.url + "/metrics").text
    assert metric(metrics, "batchproof_speculative_accepted_tokens_total") > before
    assert metric(metrics, "batchproof_speculative_draft_tokens_total") >= metric(
        metrics, "batchproof_speculative_accepted_tokens_total")
    assert metric(metrics, "batchproof_speculative_acceptance_ratio_count") > 0


def test_the_log_names_each_requests_counts_and_server_info_says_it_is_on(server):
    ask(server, 0)
    assert re.search(r"speculative: accepted \d+/\d+ drafted tokens \(\S+ \d+/\d+", server.log_file.read_text())
    info = httpx.get(server.url + "/v1/server_info").json()
    assert info["speculative"]["enabled"] is True


def test_no_speculative_turns_it_off(plain_server):
    info = httpx.get(plain_server.url + "/v1/server_info").json()
    assert info["speculative"] == {"enabled": False, "reason": "off (--no-speculative)"}


def test_the_serve_flag_is_no_speculative():
    import argparse

    from batchproof.commands.flags import dataclass_from_args
    from batchproof.commands.serve import add_arguments
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert dataclass_from_args(EngineConfig, parser.parse_args(["--no-speculative"])).speculative is False
    assert dataclass_from_args(EngineConfig, parser.parse_args([])).speculative is True
