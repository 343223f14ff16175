"""Measuring a server over HTTP, the same way for ours and a peer: c streamed requests at
once, each timed from its own chunk arrivals (decode rate, time to first token)."""

import asyncio
import time
from dataclasses import dataclass

import httpx

from batchproof.commands.bench.figures import median
from batchproof.probe.records.reply import StreamResult
from batchproof.probe.wire.stream import StreamRequest, fire

LONG_PROMPT = ("Summarise the following notes on compilers in one sentence. " + "Compilers translate programs "
               "written in one language into another, checking them, optimising them and emitting code. " * 30)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


@dataclass
class Band:
    """One rung of a concurrency ladder: c streamed requests sent at once."""

    c: int
    aggregate_tok_s: float
    per_request_tok_s: float
    ttft_s: float
    runs: int | None = None  # on a ladder: how many runs this, the median one, was kept from


def opening(n: int) -> str:
    """Words that open a prompt no server has seen (n = 12 -> 'bravo charlie'), so no prompt cache answers it."""
    return " ".join(WORDS[int(d)] for d in str(n))


def chat_body(prompt: str, max_tokens: int, model: str | None, top_logprobs: int | None = None) -> dict:
    """A greedy streamed chat request that decodes exactly `max_tokens` tokens."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "seed": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if top_logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": top_logprobs}
    return body


def fire_all(url: str, bodies: list[dict]) -> tuple[float, list[StreamResult]]:
    """Every body streamed at once to `url`'s chat route -> (wall seconds, their results)."""
    async def gather() -> tuple[float, list[StreamResult]]:
        ssl_context = httpx.create_ssl_context()  # one for all: building one per stream would stagger them
        requests = [StreamRequest(url=f"{url}/v1/chat/completions", body=body, headers={}, timeout_s=900,
                                  ssl_context=ssl_context) for body in bodies]
        started = time.perf_counter()
        results = await asyncio.gather(*(fire(request) for request in requests))
        return time.perf_counter() - started, results

    wall, results = asyncio.run(gather())
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{url}: {errors[0]}")
    return wall, results


def band(url: str, body: dict, c: int) -> Band:
    wall, results = fire_all(url, [body] * c)
    # Every server is timed from its own chunk arrivals (the probe times only `live` streams).
    rates = [(r.completion_tokens - 1) / (r.arrivals[-1] - r.arrivals[0])
             for r in results if r.completion_tokens and len(r.arrivals) >= 2 and r.arrivals[-1] > r.arrivals[0]]
    return Band(c=c, aggregate_tok_s=sum(r.completion_tokens or 0 for r in results) / wall,
                per_request_tok_s=median(rates), ttft_s=median([r.arrivals[0] for r in results]))


def median_band(url: str, body: dict, c: int, repeats: int) -> Band:
    """The run with the median aggregate rate among `repeats` runs of one rung."""
    runs = sorted((band(url, body, c) for _ in range(max(1, repeats))), key=lambda b: b.aggregate_tok_s)
    kept = runs[len(runs) // 2]
    kept.runs = len(runs)
    return kept


def decode_rate(url: str, body: dict) -> float:
    """One request alone: its decode tokens per second after the first token."""
    return band(url, body, 1).per_request_tok_s


def ttft_600(url: str, model: str | None, round_number: int, is_peer: bool) -> float:
    """Time to first token of a ~600-token prompt, streamed, alone. Each round's prompt opens
    with words of its own, so no server can answer from a prompt cache."""
    body = {"messages": [{"role": "user", "content": f"{opening(round_number)}. {LONG_PROMPT}"}], "max_tokens": 1,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if is_peer:
        body["cache_prompt"] = False  # llama-server's own prompt cache, off
    return band(url, body, 1).ttft_s


def served_model(url: str) -> str | None:
    models = httpx.get(f"{url}/v1/models", timeout=30).json().get("data") or [{}]
    return models[0].get("id")
