"""Hostile soak: 15 clients measure their per-token latency while a 16th sends maximal requests.

    python bench/hostile_soak.py [--clients 15] [--seconds 60] [--tokens 32]

Starts `batchproof serve` (with --max-logit-bias at the vocabulary's size, so the hostile
client may bias every token), then runs the same soak twice, interleaved (quiet, hostile,
quiet, hostile): the measuring clients stream greedy chat replies of --tokens tokens and
record, per request, (last token's arrival - first token's arrival) / (tokens - 1). The
hostile client cycles through: a bias on every token of the vocabulary with n = 1 and
max_tokens 64; the largest body the server reads (refused at once: a prompt that cannot fit);
a body over --max-request-mb (413 before it is read); and the longest prompt that fits (fresh
each time, so the prefix cache cannot help). Reported: the measuring clients' median per-token
latency in each run and the ratio hostile / quiet (the target: at most 1.5), /health's worst
answer time, and the hostile requests' statuses.
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from batchproof.commands.bench.servers import start_batchproof  # noqa: E402
from batchproof.common.wire import DONE, SSEReader  # noqa: E402

WORDS = "compiler parser token lattice harbor winter garden signal river market orbit lantern".split()


async def measure_one(client: httpx.AsyncClient, url: str, rng: random.Random, tokens: int) -> float | None:
    """One streamed greedy reply -> its per-token latency (s), or None if it did not finish whole."""
    topic = " ".join(rng.choices(WORDS, k=8))
    body = {"messages": [{"role": "user", "content": f"Write a story about {topic}"}], "temperature": 0,
            "max_tokens": tokens, "ignore_eos": True, "stream": True, "logprobs": True}
    arrivals: list[float] = []
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            return None
        reader = SSEReader()
        async for line in reply.aiter_lines():
            event = reader.feed(line)
            if event is None:
                continue
            if event[1] == DONE:
                break
            chunk = json.loads(event[1])
            if "error" in chunk:
                return None
            arrivals += [time.perf_counter()] * len((chunk["choices"][0].get("logprobs") or {}).get("content") or [])
    if len(arrivals) != tokens:
        return None
    return (arrivals[-1] - arrivals[0]) / (tokens - 1)


async def measuring_client(url: str, seed: int, until: float, tokens: int, latencies: list[float]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=600) as client:
        while time.monotonic() < until:
            latency = await measure_one(client, url, rng, tokens)
            if latency is not None:
                latencies.append(latency)


def hostile_bodies(vocab: int, context: int, max_request_bytes: int, rng: random.Random) -> list[tuple[str, bytes]]:
    full_bias = {"messages": [{"role": "user", "content": "Tell me everything."}], "max_tokens": 64,
                 "ignore_eos": True, "temperature": 0, "logit_bias": {str(i): 0.0 for i in range(vocab)}}
    largest = {"prompt": "x" * (max_request_bytes - 100), "max_tokens": 1}
    over = b'{"prompt": "' + b"x" * (max_request_bytes + 10) + b'"}'
    # About 3 tokens per word of 5-6 letters, fresh words each time: no prefix-cache hit.
    words = " ".join(rng.choice(WORDS) + str(rng.randint(0, 999)) for _ in range(context // 4))
    longest = {"prompt": words, "max_tokens": 1}
    return [("/v1/chat/completions", json.dumps(full_bias).encode()),
            ("/v1/completions", json.dumps(largest).encode()),
            ("/v1/completions", over),
            ("/v1/completions", json.dumps(longest).encode())]


async def hostile_client(url: str, until: float, statuses: dict, vocab: int, context: int,
                         max_request_bytes: int) -> None:
    rng = random.Random(7)
    async with httpx.AsyncClient(timeout=600) as client:
        while time.monotonic() < until:
            for path, body in hostile_bodies(vocab, context, max_request_bytes, rng):
                if time.monotonic() >= until:
                    return
                try:
                    reply = await client.post(url + path, content=body, headers={"content-type": "application/json"})
                    key = f"{path} {reply.status_code}"
                except httpx.HTTPError as e:
                    key = f"{path} {type(e).__name__}"
                statuses[key] = statuses.get(key, 0) + 1


async def health_watch(url: str, until: float, worst: list[float]) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        while time.monotonic() < until:
            started = time.perf_counter()
            await client.get(f"{url}/health")
            worst[0] = max(worst[0], time.perf_counter() - started)
            await asyncio.sleep(0.25)


async def soak(url: str, args: argparse.Namespace, hostile: bool, facts: dict) -> dict:
    latencies: list[float] = []
    statuses: dict = {}
    worst = [0.0]
    until = time.monotonic() + args.seconds
    tasks = [measuring_client(url, i, until, args.tokens, latencies) for i in range(args.clients)]
    tasks.append(health_watch(url, until, worst))
    if hostile:
        tasks.append(hostile_client(url, until, statuses, facts["vocab"], facts["context"], facts["max_request_bytes"]))
    await asyncio.gather(*tasks)
    return {"median_s": statistics.median(latencies) if latencies else float("nan"), "requests": len(latencies),
            "health_worst_s": worst[0], "hostile": statuses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    process, url = start_batchproof(["serve", "--max-logit-bias", "262144"])
    try:
        info = httpx.get(f"{url}/v1/server_info").json()
        tokenizer = httpx.get(f"{url}/tokenizer_info").json()
        facts = {"vocab": tokenizer["vocab_size"], "context": info["max_model_len"],
                 "max_request_bytes": int(info["server"]["max_request_mb"] * 2**20)}
        asyncio.run(soak(url, argparse.Namespace(**{**vars(args), "seconds": 10}), False, facts))  # warm-up
        runs = []
        for _ in range(args.rounds):
            for hostile in (False, True):
                result = asyncio.run(soak(url, args, hostile, facts))
                runs.append((hostile, result))
                print(f"{'hostile' if hostile else 'quiet  '}: median {result['median_s'] * 1000:.1f} ms/token over "
                      f"{result['requests']} replies; /health at worst {result['health_worst_s'] * 1000:.0f} ms; "
                      f"{result['hostile'] or ''}", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)
    quiet = statistics.median(r["median_s"] for h, r in runs if not h)
    loud = statistics.median(r["median_s"] for h, r in runs if h)
    print(f"hostile / quiet median per-token latency: {loud / quiet:.2f}x (target <= 1.5x)")
    return 0 if loud / quiet <= 1.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
