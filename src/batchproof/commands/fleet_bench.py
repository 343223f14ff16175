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

import argparse
import asyncio
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from batchproof.common.proc_status import status_mb
from batchproof.common.proc_tree import process_tree

PROMPT = "Write a short story about a lighthouse keeper."


def _fleet_ready(replicas: int) -> Callable[[str], bool]:
    from batchproof.commands.bench import healthy

    def ready(url: str) -> bool:
        if not healthy(url):
            return False
        listed = httpx.get(f"{url}/v1/server_info", timeout=5).json()["fleet"]["replicas"]
        return sum(r["alive"] for r in listed) == replicas

    return ready


def _tree_rss_mb(root: int) -> dict[str, float]:
    """Resident memory of a process and every descendant, by command (Ray's processes are the
    fleet process's children and grandchildren)."""
    by_name: dict[str, float] = {}
    for pid in process_tree(root):
        rss = status_mb(pid, "VmRSS")
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            title = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if rss is None:
            continue
        key = name if name.startswith("ray::") else (Path(name).name or title)
        by_name[key] = by_name.get(key, 0.0) + rss
    return by_name


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


def measure(args: argparse.Namespace) -> dict:
    from batchproof.commands.bench import _peak_rss_mb, http_decode_rate, start_batchproof

    model = ["--model", str(args.model)] if args.model else []
    started: list[subprocess.Popen] = []
    try:
        serve2, serve2_url = start_batchproof(["serve", "--num-threads", "2", *model])
        started.append(serve2)
        serve1, serve1_url = start_batchproof(["serve", "--num-threads", "1", *model])
        started.append(serve1)
        fleet, fleet_url = start_batchproof(["fleet", "--replicas", "2", "--threads-per-replica", "1", *model],
                                            _fleet_ready(2), timeout_s=300)
        started.append(fleet)
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 64, "temperature": 0,
                "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
        one_token = body | {"max_tokens": 1}
        figures: dict = {"c16": {"serve_2_threads": [], "fleet_2x1": []}, "one_token_s": {"serve_1_thread": [],
                         "fleet_2x1": []}, "decode_c1_tok_s": {"serve_1_thread": [], "fleet_2x1": []}}
        reference = None
        identical = True
        args_decode = argparse.Namespace(prompt=PROMPT, max_tokens=args.max_tokens)
        for _ in range(args.repeats):  # interleaved rounds: a slow minute hits every figure alike
            for label, url in (("serve_2_threads", serve2_url), ("fleet_2x1", fleet_url)):
                rate, entries = asyncio.run(_band(url, body, 16))
                figures["c16"][label].append(rate)
                reference = reference or entries[0]
                identical &= all(e == reference for e in entries)
            for label, url in (("serve_1_thread", serve1_url), ("fleet_2x1", fleet_url)):
                figures["one_token_s"][label].append(_latency(url, one_token, 5))
                figures["decode_c1_tok_s"][label].append(http_decode_rate(url, None, args_decode, None))
        figures["replies_bitwise_identical"] = identical
        figures["memory_mb"] = {"serve_2_threads_peak": _peak_rss_mb(serve2.pid),
                                "fleet_tree_now": _tree_rss_mb(fleet.pid)}
        return figures
    finally:
        for process in started:
            process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def report(figures: dict) -> None:
    med = statistics.median
    c16 = figures["c16"]
    ratio = med(c16["fleet_2x1"]) / med(c16["serve_2_threads"])
    print(f"c=16 aggregate: fleet 2x1 {med(c16['fleet_2x1']):.1f} tok/s, serve 2 threads "
          f"{med(c16['serve_2_threads']):.1f} tok/s: {ratio:.2f}x (rounds {c16})")
    one = figures["one_token_s"]
    added = (med(one["fleet_2x1"]) - med(one["serve_1_thread"])) * 1000
    print(f"one-token request alone: fleet {med(one['fleet_2x1']) * 1000:.1f} ms, its replica's equal "
          f"(serve, 1 thread) {med(one['serve_1_thread']) * 1000:.1f} ms: the Ray hop adds {added:.1f} ms")
    decode = figures["decode_c1_tok_s"]
    print(f"single stream: fleet {med(decode['fleet_2x1']):.1f} tok/s, serve 1 thread "
          f"{med(decode['serve_1_thread']):.1f} tok/s")
    print(f"replies bitwise identical across servers and replicas: {figures['replies_bitwise_identical']}")
    tree = figures["memory_mb"]["fleet_tree_now"]
    print(f"memory: serve (2 threads) peak {figures['memory_mb']['serve_2_threads_peak']:.0f} MB; fleet tree "
          f"{sum(tree.values()):.0f} MB: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(tree.items(),
                                                                                          key=lambda kv: -kv[1])))
