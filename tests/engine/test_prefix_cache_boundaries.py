"""The prefix cache at block boundaries (16 tokens): a reply that ends one token before a
block's end, then continued by a second turn, and a prompt that is exactly whole blocks.
Cached == recomputed, `==` on every float, against an engine without a cache."""

import pytest

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import PREFIX_BLOCK_TOKENS, Engine
from batchproof.engine.model.ops import kernels
from batchproof.engine.sampling.params import SamplingParams

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the cache needs our kernels")

BLOCK = PREFIX_BLOCK_TOKENS
NEXT_TURN = "<|im_end|>\n<|im_start|>user\nNow say it in fewer words.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def warm(engine):
    return engine  # the session's engine: the cache is on by default


@pytest.fixture(scope="module")
def cold():
    return Engine(EngineConfig(device="cpu", max_batch=2, prefix_cache=False))


def params(max_tokens: int = 6, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, top_logprobs=3, **extra)


def run(engine: Engine, rid: str, ids: list[int], sampling: SamplingParams) -> list:
    return engine.generate({rid: (ids, sampling)})[rid]


def signature(outputs: list) -> tuple:
    """Every id and float a reply carries, exactly."""
    records = [(r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
               for out in outputs for r in out.records]
    prompt = outputs[0].prompt_records
    scored = None if prompt is None else [
        None if r is None else (r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
        for r in prompt]
    return records, scored, [i for out in outputs for i in out.token_ids]


def test_a_reply_retired_one_token_short_of_a_block_serves_the_next_turn_with_the_same_bits(warm, cold):
    """Turn one's reply ends where prompt + reply fill whole blocks: its last token was chosen
    but never fed back, so the retired sequence computed num_tokens - 1 positions and its last
    block is not whole. Turn two (prompt, reply, next user turn) reuses every whole block
    before it and computes the rest: bitwise the reply of an engine without a cache."""
    turn_one = warm.chat_prompt_ids([{"role": "user", "content": "Describe a harbour at dawn, gull by gull."}])
    num_tokens = (len(turn_one) // BLOCK + 2) * BLOCK  # prompt + reply: a multiple of 16, 17..32 tokens of reply
    reply = run(warm, "one", turn_one, params(max_tokens=num_tokens - len(turn_one)))
    reply_ids = [i for out in reply for i in out.token_ids]
    assert len(turn_one) + len(reply_ids) == num_tokens  # retired with num_computed + 1 == 16 * k
    turn_two = turn_one + reply_ids + warm.tokenizer.encode(NEXT_TURN)
    hot = run(warm, "two", turn_two, params())
    fresh = run(cold, "two-cold", turn_two, params())
    assert hot[-1].num_cached_tokens >= num_tokens - BLOCK  # the reply's whole blocks came from the cache
    assert fresh[-1].num_cached_tokens == 0
    assert signature(hot) == signature(fresh)


@pytest.mark.parametrize("prompt_logprobs", [None, 2], ids=["plain", "scored"])
def test_a_prompt_of_exactly_two_blocks_sent_twice_is_the_same_bits(warm, cold, prompt_logprobs):
    """The last prompt token is always computed (its logits choose the first reply token), so
    a prompt of whole blocks takes all but its last block from the cache."""
    text = f"Case {prompt_logprobs}: the tide tables of the northern coast list high water twice a day, " * 3
    ids = warm.tokenizer.encode(text)[:2 * BLOCK]
    assert len(ids) == 2 * BLOCK
    sampling = params(prompt_logprobs=prompt_logprobs)
    first = run(warm, f"first{prompt_logprobs}", ids, sampling)
    second = run(warm, f"second{prompt_logprobs}", ids, sampling)
    assert second[-1].num_cached_tokens == BLOCK
    assert signature(second) == signature(first) == signature(run(cold, f"cold{prompt_logprobs}", ids, sampling))
