"""Soak test: many concurrent streams with random lengths, some clients hanging up mid-stream.

    python bench/soak.py [--clients 64] [--seconds 60] [--disconnect 0.1] [--prefix-cache-mb 64] [--url URL]

Without --url it starts `batchproof serve` itself (prefix cache on, with a small budget so
that it fills and evicts). Every request must either complete with one logprob entry per
completion token, or get a clear error; the prefix cache must never hold more than its
budget (sampled every half second); afterwards the server must be idle with every slot
free and its resident memory back near the level measured after a warm-up round, plus
what the cache grew by.
"""

import argparse
import asyncio
import json
import random
import re
import socket
import subprocess
import sys
import time

import httpx

from batchproof.common.proc_status import status_mb
from batchproof.common.wire import DONE, SSEReader

WORDS = "compiler parser token lattice harbor winter garden signal river market orbit lantern".split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def rss_mb(pid: int) -> float:
    rss = status_mb(pid, "VmRSS")
    return float("nan") if rss is None else rss


async def one_request(client: httpx.AsyncClient, url: str, rng: random.Random, p_disconnect: float) -> str:
    prompt = " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))
    body = {"messages": [{"role": "user", "content": f"Write about {prompt}"}], "temperature": rng.choice([0, 0.8]),
            "max_tokens": rng.randint(1, 64), "stream": True, "stream_options": {"include_usage": True},
            "logprobs": True, "top_logprobs": rng.randint(0, 5)}
    hang_up_after = rng.randint(1, 10) if rng.random() < p_disconnect else None
    entries, usage, chunks, done = 0, None, 0, False
    async with client.stream("POST", url, json=body) as reply:
        if reply.status_code != 200:
            return f"http {reply.status_code}"
        reader = SSEReader()
        async for line in reply.aiter_lines():
            event = reader.feed(line)
            if event is None:
                continue
            if event[1] == DONE:
                done = True
                break
            chunk = json.loads(event[1])
            if "error" in chunk:
                return "error event"
            chunks += 1
            for choice in chunk.get("choices", []):
                entries += len((choice.get("logprobs") or {}).get("content") or [])
            usage = chunk.get("usage") or usage
            if hang_up_after is not None and chunks >= hang_up_after:
                return "disconnected"
    if not done or usage is None:
        return "incomplete"
    return "ok" if entries == usage["completion_tokens"] else f"inconsistent {entries}/{usage['completion_tokens']}"


async def client_loop(url: str, seed: int, until: float, p_disconnect: float, tally: dict) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=300) as client:
        while time.monotonic() < until:
            try:
                outcome = await one_request(client, url, rng, p_disconnect)
            except httpx.HTTPError as e:
                outcome = f"transport {type(e).__name__}"
            tally[outcome] = tally.get(outcome, 0) + 1


async def watch_cache(url: str, until: float, seen: dict) -> None:
    """The prefix cache's bytes against its budget, every half second."""
    async with httpx.AsyncClient(timeout=30) as client:
        while time.monotonic() < until:
            text = (await client.get(f"{url}/metrics")).text
            seen["max_bytes"] = max(seen.get("max_bytes", 0), metric(text, "batchproof_prefix_cache_bytes"))
            seen["budget"] = metric(text, "batchproof_prefix_cache_budget_bytes")
            await asyncio.sleep(0.5)


async def soak(url: str, clients: int, seconds: float, p_disconnect: float, seen: dict) -> dict:
    tally: dict = {}
    until = time.monotonic() + seconds
    await asyncio.gather(watch_cache(url, until, seen),
                         *(client_loop(f"{url}/v1/chat/completions", i, until, p_disconnect, tally)
                           for i in range(clients)))
    return tally


def wait_idle(url: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics").text
        if metric(text, "batchproof_running_requests") == 0 and metric(text, "batchproof_queue_depth") == 0:
            return text
        if time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--disconnect", type=float, default=0.1)
    parser.add_argument("--prefix-cache-mb", type=int, default=64)
    args = parser.parse_args()
    process = None
    url = args.url
    if url is None:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "batchproof", "serve", "--port", str(port),
                                    "--prefix-cache-mb", str(args.prefix_cache_mb)], stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
    try:
        seen: dict = {}
        asyncio.run(soak(url, args.clients, 10, args.disconnect, seen))  # warm-up: every slot and its KV touched
        before = wait_idle(url)
        rss_before = rss_mb(process.pid) if process else float("nan")
        started = time.monotonic()
        tally = asyncio.run(soak(url, args.clients, args.seconds, args.disconnect, seen))
        elapsed = time.monotonic() - started
        after = wait_idle(url)
        rss_after = rss_mb(process.pid) if process else float("nan")
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    total = sum(tally.values())
    bad = {k: v for k, v in tally.items() if k not in ("ok", "disconnected")}
    print(f"soak: {args.clients} clients for {elapsed:.0f} s: {total} requests: {tally}")
    print(f"free slots before/after: {metric(before, 'batchproof_free_slots'):.0f} / "
          f"{metric(after, 'batchproof_free_slots'):.0f}; running after: "
          f"{metric(after, 'batchproof_running_requests'):.0f}; "
          f"queue after: {metric(after, 'batchproof_queue_depth'):.0f}")
    cache_growth = (metric(after, "batchproof_prefix_cache_bytes") - metric(before, "batchproof_prefix_cache_bytes"))
    cache_growth = 0.0 if cache_growth != cache_growth else cache_growth / 2**20  # NaN: the cache is off
    print(f"resident memory after warm-up / after soak: {rss_before:.0f} MB / {rss_after:.0f} MB "
          f"(the prefix cache grew {cache_growth:.0f} MB)")
    over_budget = seen.get("max_bytes", 0) > seen.get("budget", float("inf"))
    print(f"prefix cache: at most {seen.get('max_bytes', 0) / 2**20:.1f} MB held, "
          f"budget {seen.get('budget', float('nan')) / 2**20:.0f} MB")
    leaked = (metric(after, "batchproof_free_slots") != metric(before, "batchproof_free_slots")
              or metric(after, "batchproof_running_requests") != 0
              or rss_after > (rss_before + cache_growth) * 1.1)
    if bad or leaked or over_budget:
        print(f"soak: FAILED ({bad or ('prefix cache over budget' if over_budget else 'leak')})")
        return 1
    print("soak: OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
