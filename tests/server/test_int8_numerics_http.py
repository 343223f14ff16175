"""The int8 numerics (--numerics int8) keeps every promise the float path makes, through the
server: the rollouts' logprobs re-score bit for bit (echo and prompt_logprobs), alone == inside a
batch of 16 == streamed == whole, with the prefix cache on and off; and it names itself
(server_info's numerics and numerics_id differ from the float path's, so witnesses and the
fleet never mix the two)."""

import httpx
import pytest

from batchproof.engine.model.ops import kernels
from tests.helpers.http import post
from tests.helpers.live_server import live_server
from tests.server.test_rescoring import BATCH_VARIANTS, CHAT, VARIANTS, assert_rescored, rollout, rollouts_together

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the kernels are not built here")


@pytest.fixture(scope="module")
def int8_server():
    with live_server(None, engine_settings={"numerics": "int8"}) as server:
        yield server


def test_int8_rollouts_rescore_bitwise_alone_batched_streamed(int8_server, server) -> None:
    alone = [rollout(int8_server.url, v) for v in VARIANTS]
    batched = rollouts_together(int8_server.url, BATCH_VARIANTS)
    assert_rescored(int8_server.url, alone + batched)
    assert batched[:len(VARIANTS)] == alone
    by_key = {(v.route, v.temperature): r for v, r in zip(VARIANTS, alone) if not v.is_streamed}
    for v, r in zip(VARIANTS, alone):
        assert r == by_key[(v.route, v.temperature)], v  # streamed == whole
    with live_server(None, engine_settings={"numerics": "int8", "prefix_cache": False}) as uncached:
        assert rollouts_together(uncached.url, BATCH_VARIANTS) == batched  # cached == recomputed
    # Another arithmetic: the float server's logprobs are not these (the same prompt, greedy).
    float_greedy = rollout(server.url, VARIANTS[0])
    assert float_greedy.logprobs != alone[0].logprobs


def test_the_numerics_is_named(int8_server, server) -> None:
    ours, theirs = (httpx.get(s.url + "/v1/server_info", timeout=30).json() for s in (int8_server, server))
    assert "int8 activations" in ours["numerics"] and "int8" not in theirs["numerics"]
    assert ours["numerics_id"] != theirs["numerics_id"]
    reply = post(int8_server.url, CHAT, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                                        "logprobs": True, "top_logprobs": 3})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["logprobs"]["content"]) >= 1
