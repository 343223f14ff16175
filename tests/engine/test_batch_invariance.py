"""Batch invariance, bitwise: a greedy request's tokens and logprobs are the same (`==`,
not allclose) alone and inside batches of 4, 8 and 16, joining at any step, in a
recycled slot, streamed or not, through the engine and through HTTP."""

import asyncio
import json
import re
import threading

import httpx
import pytest

from batchproof.engine.sampling.params import SamplingParams
from tests.helpers.http import wait_until

PROMPTS = [
    "Hi",
    "What is 2 + 2?",
    "Write an essay on compilers.",
    "Name three colours of the rainbow and say why the sky is blue.",
    "Translate 'good morning' into French, German and Spanish, with a note on pronunciation.",
    "List the planets of the solar system in order from the sun, with one fact about each of them.",
    "You are a careful assistant. Explain, step by step, how a hash table handles collisions, "
    "and compare open addressing with separate chaining in terms of memory and speed.",
    "Tell me a story about a lighthouse keeper who finds a message in a bottle during a winter storm, "
    "and how it changes the way she thinks about the sea, her family and the village she left behind.",
]
MAX_TOKENS = 16
TOP = 5


def signature(outputs) -> list[tuple]:
    """Every token with its logprob and top alternatives, exactly as computed."""
    return [(r.token_id, r.logprob, tuple((t.token_id, t.logit, t.logprob) for t in r.top))
            for out in outputs for r in out.records]


def greedy(max_tokens: int = MAX_TOKENS, **extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, top_logprobs=TOP, **extra)


@pytest.fixture(scope="module")
def prompt_ids(engine):
    return [engine.chat_prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]


@pytest.fixture(scope="module")
def alone(engine, prompt_ids):
    """Each prompt served alone (m = 1)."""
    results = []
    for i, ids in enumerate(prompt_ids):
        results.append(signature(engine.generate({f"alone{i}": (ids, greedy())})[f"alone{i}"]))
        assert engine.take_batch_summary() is None  # generate() consumed it; the engine is idle
    assert all(len(r) == MAX_TOKENS for r in results)
    return results


@pytest.mark.parametrize("size", [4, 8, 16])
def test_batched_equals_alone(engine, prompt_ids, alone, size):
    # Mixed lengths, and at 16 each prompt twice (in different slots).
    picks = [i % len(PROMPTS) for i in range(size)]
    if size == 4:
        picks = [0, 3, 6, 7]
    requests = {f"b{size}-{j}": (prompt_ids[i], greedy()) for j, i in enumerate(picks)}
    outputs = engine.generate(requests)
    for j, i in enumerate(picks):
        assert signature(outputs[f"b{size}-{j}"]) == alone[i], f"prompt {i} in slot {j} of a batch of {size}"


def test_joins_mid_batch_and_recycled_slots(engine, prompt_ids, alone):
    """Requests join at different steps; short ones finish early and newcomers take
    their slots (and stale KV) while the others are mid-decode."""
    schedule = {0: [0, 5], 2: [2], 5: [7, 1], 9: [3, 4, 6]}  # step -> prompts arriving then
    fillers = {f"short{k}": (prompt_ids[k % 8], greedy(max_tokens=3)) for k in range(13)}
    for request_id, (ids, params) in fillers.items():
        engine.add_request(request_id, ids, params)  # 13 short + 2 early arrivals fill 15 of 16 slots
    outputs: dict[str, list] = {}
    step = 0
    while engine.has_work() or step <= max(schedule):
        for i in schedule.get(step, []):
            engine.add_request(f"join{step}-{i}", prompt_ids[i], greedy())
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        step += 1
    engine.take_batch_summary()
    for step_joined, picks in schedule.items():
        for i in picks:
            assert signature(outputs[f"join{step_joined}-{i}"]) == alone[i], f"prompt {i} joining at step {step_joined}"


def test_seeded_sampling_alone_equals_batched(engine, prompt_ids):
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=12, ignore_eos=True,
                            top_logprobs=2, repetition_penalty=1.1, presence_penalty=0.3)
    alone_run = signature(engine.generate({"s": (prompt_ids[2], params)})["s"])
    others = {f"o{i}": (prompt_ids[i], greedy(max_tokens=12)) for i in (0, 4, 6)}
    batched = engine.generate({"o-first": (prompt_ids[7], greedy(8)), "s": (prompt_ids[2], params), **others})
    assert signature(batched["s"]) == alone_run


def test_batch_summary_reports_the_batch_that_formed(engine, prompt_ids):
    for i in range(6):
        engine.add_request(f"m{i}", prompt_ids[i], greedy(max_tokens=4))
    while engine.has_work():
        engine.step()
    summary = engine.take_batch_summary()
    assert summary is not None and summary.max_batch_size == 6
    assert summary.num_tokens == 6 * 4


# --- through HTTP ----------------------------------------------------------------------------
# How many of a burst's requests meet in one batch is the machine's timing (the batch window
# against arrivals), so it is not left to timing here: the burst's first request is admitted
# only once the rest are queued behind it, and the engine takes them all before its first step.
# The bits are judged against the alone runs; the batch that formed, from the engine's own record.

HANG_GUARD_S = 60  # only a hung server waits this long


def admit_together(monkeypatch, backend, n: int) -> None:
    """The next burst of n requests: its first is admitted once the other n - 1 are queued."""
    add_request, queued = backend.engine.add_request, threading.Event()

    def add_once_the_burst_is_queued(*args, **kwargs):
        if not queued.is_set():
            assert wait_until(lambda: backend.num_waiting >= n - 1, timeout=HANG_GUARD_S)
            queued.set()
        return add_request(*args, **kwargs)

    monkeypatch.setattr(backend.engine, "add_request", add_once_the_burst_is_queued)


def record_decode_sizes(monkeypatch, engine) -> list[int]:
    """How many sequences each decode step runs together (the engine's m, step by step)."""
    sizes, decode = [], engine.runner.decode

    def recorded(seqs):
        sizes.append(len(seqs))
        return decode(seqs)

    monkeypatch.setattr(engine.runner, "decode", recorded)
    return sizes


def chat_body(prompt: str, stream: bool) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "logprobs": True, "top_logprobs": TOP, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def fetch(client: httpx.AsyncClient, url: str, prompt: str, stream: bool) -> list:
    """The reply's logprob entries, exactly as JSON carried them."""
    if not stream:
        reply = await client.post(url, json=chat_body(prompt, False))
        reply.raise_for_status()
        return reply.json()["choices"][0]["logprobs"]["content"]
    entries = []
    async with client.stream("POST", url, json=chat_body(prompt, True)) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    entries += (choice.get("logprobs") or {}).get("content") or []
    return entries


def run_concurrently(url: str, jobs: list[tuple[str, bool]]) -> list[list]:
    async def main():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.gather(*(fetch(client, url, p, s) for p, s in jobs))
    return asyncio.run(main())


def test_http_batch_of_16_equals_alone_streamed_and_not(server, monkeypatch):
    url = f"{server.url}/v1/chat/completions"
    alone = [run_concurrently(url, [(p, True)])[0] for p in PROMPTS]
    # 16 at once, one batch: every prompt twice, once streamed and once not.
    jobs = [(p, stream) for stream in (True, False) for p in PROMPTS]
    admit_together(monkeypatch, server.state.backend, len(jobs))
    sizes = record_decode_sizes(monkeypatch, server.state.backend.engine)
    together = run_concurrently(url, jobs)
    for k, ((prompt, stream), entries) in enumerate(zip(jobs, together)):
        assert entries == alone[k % len(PROMPTS)], f"{prompt!r} streamed={stream}"
    # Every reply has ended, so every decode step has run: all 16 decoded together.
    assert sizes == [16] * (MAX_TOKENS - 1), sizes
    # And the batch log says so, as the engine goes idle just after the last reply (its
    # histogram observed first, so the next test's scrapes see this batch already counted).
    assert wait_until(lambda: "batch m=16 done" in server.log_file.read_text(), timeout=HANG_GUARD_S)


def test_http_histogram_counts_the_batch(server, monkeypatch):
    url = f"{server.url}/v1/chat/completions"

    def bucket(text: str, le: str) -> float:
        return float(re.search(rf'batchproof_batch_size_bucket{{le="{re.escape(le)}"}} ([0-9.e+]+)', text).group(1))

    def scrape() -> str:
        return httpx.get(f"{server.url}/metrics").text

    before = scrape()
    admit_together(monkeypatch, server.state.backend, 4)
    run_concurrently(url, [(p, True) for p in PROMPTS[:4]])
    # The batch is observed as the engine goes idle, just after the replies.
    assert wait_until(lambda: bucket(scrape(), "+Inf") > bucket(before, "+Inf"), timeout=HANG_GUARD_S)
    after = scrape()
    assert bucket(after, "+Inf") - bucket(before, "+Inf") == 1
    assert bucket(after, "4.0") - bucket(before, "4.0") == 1
    assert bucket(after, "3.0") - bucket(before, "3.0") == 0
