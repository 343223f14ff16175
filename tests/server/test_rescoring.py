"""Exact re-scoring (docs/rl-rollouts.md): the logprobs a generation returns equal, bit for bit,
those that scoring its prompt and generated token ids (`return_token_ids`) returns afterwards,
through `/v1/completions` echo and through `prompt_logprobs`: greedy and sampled, chat and
completions, streamed and not, alone and inside a batch of 16, with and without the prefix cache."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from batchproof.engine.outputs import RequestOutput
from batchproof.server.chat.formatter import ChatFormatter, ChatShape
from batchproof.server.completions.formatter import CompletionsFormatter, CompletionsShape
from batchproof.server.errors import APIError
from batchproof.server.serving import sse_events
from tests.helpers.http import CJK_PROMPT, EMOJI_PROMPT, chunks, joined_bytes, messages, post, stream
from tests.helpers.live_server import live_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
CHAT_PROMPT = "Write one sentence about the sea."
TEXT_PROMPT = "The sea at night is"
MAX_TOKENS = 10
BATCH = 16


@dataclass(frozen=True)
class Variant:
    route: str  # CHAT or COMPLETIONS
    is_streamed: bool
    temperature: float  # 0: greedy
    seed: int


# Every route x streamed x (greedy, 0.9, 1.2): 12 requests; the batch adds 4 more seeds.
VARIANTS = [Variant(route, is_streamed, temperature, seed) for route in (CHAT, COMPLETIONS)
            for is_streamed in (False, True) for temperature, seed in ((0.0, 0), (0.9, 7), (1.2, 11))]
BATCH_VARIANTS = VARIANTS + [Variant(v.route, v.is_streamed, v.temperature, v.seed + 100)
                             for v in VARIANTS if v.temperature > 0][:BATCH - len(VARIANTS)]


@dataclass(frozen=True)
class Rollout:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]  # of each generated token, in the default (raw) mode


def _body(v: Variant) -> dict:
    common = {"max_tokens": MAX_TOKENS, "temperature": v.temperature, "seed": v.seed, "return_token_ids": True}
    if v.route == CHAT:
        return {"messages": messages(CHAT_PROMPT), "logprobs": True, **common}
    return {"prompt": TEXT_PROMPT, "logprobs": 0, **common}


def _logprobs(route: str, choice: dict) -> list[float]:
    if route == CHAT:
        return [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return choice["logprobs"]["token_logprobs"]


def _streamed(url: str, v: Variant) -> Rollout:
    """The stream's ids, concatenated; each chunk's ids number the entries it carries."""
    _, _, events = stream(url, v.route, _body(v))
    body = chunks(events)
    prompt_ids = body[0]["prompt_token_ids"] if v.route == CHAT else body[0]["choices"][0]["prompt_token_ids"]
    token_ids, logprobs = [], []
    for i, chunk in enumerate(body):
        assert ("prompt_token_ids" in chunk or "prompt_token_ids" in chunk["choices"][0]) == (i == 0)
        if v.route == CHAT and i == 0:
            continue  # the role chunk carries no token
        (choice,) = chunk["choices"]
        entries = _logprobs(v.route, choice) if choice.get("logprobs") else []
        assert len(choice["token_ids"]) == len(entries), chunk
        token_ids += choice["token_ids"]
        logprobs += entries
    return Rollout(prompt_ids, token_ids, logprobs)


def rollout(url: str, v: Variant) -> Rollout:
    if v.is_streamed:
        return _streamed(url, v)
    reply = post(url, v.route, _body(v))
    assert reply.status_code == 200, reply.text
    (choice,) = reply.json()["choices"]
    prompt_ids = reply.json()["prompt_token_ids"] if v.route == CHAT else choice["prompt_token_ids"]
    return Rollout(prompt_ids, choice["token_ids"], _logprobs(v.route, choice))


def rollouts_together(url: str, variants: list[Variant]) -> list[Rollout]:
    """All at once, so the engine decodes them in one batch."""
    with ThreadPoolExecutor(len(variants)) as pool:
        return list(pool.map(lambda v: rollout(url, v), variants))


def score_by_echo(url: str, rollouts: list[Rollout]) -> list[list[float]]:
    """Prompt + generated ids scored as one prompt each (echo, max_tokens 0): the generated part."""
    reply = post(url, COMPLETIONS, {"prompt": [r.prompt_ids + r.token_ids for r in rollouts], "echo": True,
                                    "max_tokens": 0, "logprobs": 0})
    assert reply.status_code == 200, reply.text
    return [choice["logprobs"]["token_logprobs"][len(r.prompt_ids):]
            for r, choice in zip(rollouts, reply.json()["choices"], strict=True)]


def score_by_prompt_logprobs(url: str, rollouts: list[Rollout]) -> list[list[float]]:
    """The same through vLLM's prompt_logprobs (each entry keyed by the token's id)."""
    reply = post(url, COMPLETIONS, {"prompt": [r.prompt_ids + r.token_ids for r in rollouts], "max_tokens": 1,
                                    "temperature": 0, "prompt_logprobs": 0})
    assert reply.status_code == 200, reply.text
    return [[entry[str(token_id)]["logprob"] for token_id, entry in
             zip(r.token_ids, choice["prompt_logprobs"][len(r.prompt_ids):], strict=True)]
            for r, choice in zip(rollouts, reply.json()["choices"], strict=True)]


def assert_rescored(url: str, rollouts: list[Rollout]) -> None:
    for r in rollouts:
        assert r.token_ids and len(r.token_ids) == len(r.logprobs) <= MAX_TOKENS
    # (lists of floats compare exactly: JSON round-trips a float's bits)
    assert score_by_echo(url, rollouts) == [r.logprobs for r in rollouts]
    assert score_by_prompt_logprobs(url, rollouts) == [r.logprobs for r in rollouts]


@pytest.fixture(scope="module")
def cached(server) -> dict[str, list[Rollout]]:
    """The rollouts on the shared server (prefix cache on): each variant alone, then all in a batch."""
    return {"alone": [rollout(server.url, v) for v in VARIANTS],
            "batched": rollouts_together(server.url, BATCH_VARIANTS)}


def test_rescoring_returns_the_rollouts_logprobs(server, cached) -> None:
    assert_rescored(server.url, cached["alone"] + cached["batched"])
    # Two more routes to the same answer: alone == inside the batch, streamed == not.
    assert cached["batched"][:len(VARIANTS)] == cached["alone"]
    by_key = {(v.route, v.temperature): r for v, r in zip(VARIANTS, cached["alone"]) if not v.is_streamed}
    for v, r in zip(VARIANTS, cached["alone"]):
        assert r == by_key[(v.route, v.temperature)], v
    assert any(r.token_ids != by_key[(CHAT, 0.0)].token_ids for r in cached["alone"][1:3])  # sampling sampled


def test_rescoring_without_the_prefix_cache(cached) -> None:
    with live_server(None, engine_settings={"prefix_cache": False}) as uncached:
        batched = rollouts_together(uncached.url, BATCH_VARIANTS)
        assert_rescored(uncached.url, batched)
    assert batched == cached["batched"]  # cached == recomputed


@pytest.mark.parametrize("prompt", [EMOJI_PROMPT, CJK_PROMPT], ids=["emoji", "cjk"])
def test_streamed_ids_ride_with_their_text(server, prompt) -> None:
    """Under the UTF-8 hold, a chunk's ids are exactly those of the entries it carries, and the
    stream's ids are the unstreamed reply's."""
    tokenizer = server.state.front.tokenizer
    body = {"messages": messages(prompt), "temperature": 0, "max_tokens": 12, "logprobs": True,
            "return_token_ids": True}
    whole = post(server.url, CHAT, body).json()
    token_ids = []
    for chunk in chunks(stream(server.url, CHAT, body)[2])[1:]:
        (choice,) = chunk["choices"]
        entries = choice["logprobs"]["content"] if choice.get("logprobs") else []
        assert b"".join(tokenizer.decode_bytes(t) for t in choice["token_ids"]) == joined_bytes(entries)
        token_ids += choice["token_ids"]
    assert token_ids == whole["choices"][0]["token_ids"]
    assert len(token_ids) == whole["usage"]["completion_tokens"]


def test_ids_are_sent_only_when_asked(server) -> None:
    chat = post(server.url, CHAT, {"messages": messages(CHAT_PROMPT), "temperature": 0, "max_tokens": 2}).json()
    assert "prompt_token_ids" not in chat and "token_ids" not in chat["choices"][0]
    plain = post(server.url, COMPLETIONS, {"prompt": TEXT_PROMPT, "max_tokens": 2, "return_token_ids": False}).json()
    assert "prompt_token_ids" not in plain["choices"][0] and "token_ids" not in plain["choices"][0]


def _short_of_one() -> RequestOutput:
    """A last delta whose ids number one token fewer than the reply kept."""
    return RequestOutput("r-0", "ab", [], num_prompt_tokens=2, num_output_tokens=2, finish_reason="length",
                         num_kept_tokens=2, token_ids=[7])


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_ids_that_do_not_number_the_tokens_fail_closed(route) -> None:
    """Never a 200 (whole: a 500), and a stream ends on the error without [DONE] or usage."""
    def formatter():
        if route == CHAT:
            return ChatFormatter("r", "m", None, [1, 2], 1,
                                 ChatShape(wants_records=False, include_usage=True, return_token_ids=True))
        shape = CompletionsShape(num_logprobs=None, echo=False, num_prompt_logprobs=None, include_usage=True,
                                 return_token_ids=True)
        return CompletionsFormatter("r", "m", None, [[1, 2]], 1, shape)

    with pytest.raises(APIError) as failed:
        formatter().whole([[_short_of_one()]])
    assert failed.value.status == 500 and "token_ids fail closed: 1 ids for 2" in str(failed.value)
    raw = asyncio.run(_runner_stream(formatter(), _short_of_one()))
    assert raw.endswith(b"\n\n") and b"[DONE]" not in raw and b'"usage"' not in raw
    assert "token_ids fail closed: 1 ids for 2" in json.loads(raw.split(b"data: ")[-1])["error"]["message"]


async def _runner_stream(formatter, *outputs: RequestOutput) -> bytes:
    """What the runner streams for these deltas of choice 0."""

    async def deltas():
        for out in outputs:
            yield 0, out

    return b"".join([chunk async for chunk in sse_events(deltas(), 60, formatter)])
