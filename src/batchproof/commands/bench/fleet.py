"""What a fleet buys and costs, over HTTP: `batchproof fleet` (2 replicas x 1 thread) against
one `batchproof serve` with 2 threads, on the same machine, in interleaved rounds; and a
`batchproof serve` with 1 thread, whose engine equals one replica's, so the difference in a
request's latency is what the Ray hop adds. Used by `batchproof bench --fleet`;
docs/fleet.md quotes its figures.

- aggregate decode at c=16 (the probe's greedy request, 64 tokens, every reply checked to be
  bitwise the single server's);
- latency of a one-token request and single-stream decode, fleet vs its replica's equal;
- resident memory: the single server, and the fleet's whole process tree (ingress, Ray's own
  processes, the replicas).
"""

import asyncio
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from batchproof.commands.bench import http, servers

PROMPT = "Write a short story about a lighthouse keeper."
# The servers, as the figures name them.
SERVE_2, SERVE_1, FLEET = "serve_2_threads", "serve_1_thread", "fleet_2x1"


@dataclass
class FleetMemory:
    serve_2_threads_peak: float | None
    fleet_tree_now: dict[str, float]  # command -> resident MB, every process of the fleet's tree


@dataclass
class FleetFigures:
    """Per figure, server -> one value per round."""

    c16: dict[str, list[float]]  # aggregate tok/s, SERVE_2 and FLEET
    one_token_s: dict[str, list[float]]  # SERVE_1 and FLEET
    decode_c1_tok_s: dict[str, list[float]]  # SERVE_1 and FLEET
    replies_bitwise_identical: bool = True
    memory_mb: FleetMemory | None = None


def _fleet_ready(replicas: int) -> Callable[[str], bool]:
    def ready(url: str) -> bool:
        if not servers.healthy(url):
            return False
        listed = httpx.get(f"{url}/v1/server_info", timeout=5).json()["fleet"]["replicas"]
        return sum(r["alive"] for r in listed) == replicas

    return ready


async def _band(url: str, body: dict, c: int) -> tuple[float, list]:
    """Aggregate tok/s of c concurrent greedy requests, and their replies' logprob entries."""
    async with httpx.AsyncClient(timeout=600) as client:
        started = time.perf_counter()
        replies = await asyncio.gather(*(client.post(f"{url}/v1/chat/completions", json=body) for _ in range(c)))
        wall = time.perf_counter() - started
    for reply in replies:
        reply.raise_for_status()
    tokens = sum(r.json()["usage"]["completion_tokens"] for r in replies)
    return tokens / wall, [r.json()["choices"][0]["logprobs"]["content"] for r in replies]


def _latency(url: str, body: dict, repeats: int) -> float:
    """Median wall time of one unstreamed request, alone."""
    times = []
    with httpx.Client(timeout=120) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            client.post(f"{url}/v1/chat/completions", json=body).raise_for_status()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rounds(urls: dict[str, str], max_tokens: int, repeats: int) -> FleetFigures:
    """Every figure once per round, rounds interleaved: a slow minute hits every figure alike."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    one_token = body | {"max_tokens": 1}
    decode = http.chat_body(PROMPT, max_tokens, model=None)
    figures = FleetFigures(c16={SERVE_2: [], FLEET: []}, one_token_s={SERVE_1: [], FLEET: []},
                           decode_c1_tok_s={SERVE_1: [], FLEET: []})
    reference = None
    for _ in range(repeats):
        for label in (SERVE_2, FLEET):
            rate, entries = asyncio.run(_band(urls[label], body, 16))
            figures.c16[label].append(rate)
            reference = reference or entries[0]
            figures.replies_bitwise_identical &= all(e == reference for e in entries)
        for label in (SERVE_1, FLEET):
            figures.one_token_s[label].append(_latency(urls[label], one_token, 5))
            figures.decode_c1_tok_s[label].append(http.decode_rate(urls[label], decode))
    return figures


def measure(model: Path | None, max_tokens: int, repeats: int) -> FleetFigures:
    model_flags = ["--model", str(model)] if model else []
    commands = {SERVE_2: (["serve", "--num-threads", "2", *model_flags], servers.healthy, 120),
                SERVE_1: (["serve", "--num-threads", "1", *model_flags], servers.healthy, 120),
                FLEET: (["fleet", "--replicas", "2", "--threads-per-replica", "1", *model_flags], _fleet_ready(2), 300)}
    started: dict[str, subprocess.Popen] = {}
    urls: dict[str, str] = {}
    try:
        for label, (command, ready, timeout_s) in commands.items():
            started[label], urls[label] = servers.start_batchproof(command, ready, timeout_s=timeout_s)
        figures = _rounds(urls, max_tokens, repeats)
        figures.memory_mb = FleetMemory(serve_2_threads_peak=servers.peak_rss_mb(started[SERVE_2].pid),
                                        fleet_tree_now=servers.tree_rss_mb(started[FLEET].pid))
        return figures
    finally:
        servers.stop(started.values(), timeout_s=60)


def report(figures: FleetFigures) -> None:
    med = statistics.median
    c16 = figures.c16
    ratio = med(c16[FLEET]) / med(c16[SERVE_2])
    print(f"c=16 aggregate: fleet 2x1 {med(c16[FLEET]):.1f} tok/s, serve 2 threads "
          f"{med(c16[SERVE_2]):.1f} tok/s: {ratio:.2f}x (rounds {c16})")
    one = figures.one_token_s
    added = (med(one[FLEET]) - med(one[SERVE_1])) * 1000
    print(f"one-token request alone: fleet {med(one[FLEET]) * 1000:.1f} ms, its replica's equal "
          f"(serve, 1 thread) {med(one[SERVE_1]) * 1000:.1f} ms: the Ray hop adds {added:.1f} ms")
    decode = figures.decode_c1_tok_s
    print(f"single stream: fleet {med(decode[FLEET]):.1f} tok/s, serve 1 thread {med(decode[SERVE_1]):.1f} tok/s")
    print(f"replies bitwise identical across servers and replicas: {figures.replies_bitwise_identical}")
    memory = figures.memory_mb
    tree = memory.fleet_tree_now
    peak = f"{memory.serve_2_threads_peak:.0f}" if memory.serve_2_threads_peak is not None else "?"
    print(f"memory: serve (2 threads) peak {peak} MB; fleet tree {sum(tree.values()):.0f} MB: "
          + ", ".join(f"{k} {v:.0f}" for k, v in sorted(tree.items(), key=lambda kv: -kv[1])))
