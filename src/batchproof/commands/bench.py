"""`batchproof bench`: load, prefill and decode speed of the engine, and of servers over HTTP.

Every figure is measured in this run; `--vs URL` measures a peer server (llama.cpp's
llama-server, say) with the same workload right after ours, so ratios compare like
with like on one machine.
"""

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from batchproof.common.net import free_port
from batchproof.common.proc_status import status_mb

DEFAULT_PROMPT = "Write an essay on compilers."
LONG_PROMPT = ("Summarise the following notes on compilers in one sentence. " + "Compilers translate programs "
               "written in one language into another, checking them, optimising them and emitting code. " * 30)
PREFILL_TEXT = ("Compilers translate programs written in one language into another, checking them, "
                "optimising them and emitting code a machine can run. ") * 24


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="GGUF file or packaged model name (default: smollm2-135m)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per decode measurement")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is reported)")
    parser.add_argument("--no-engine", action="store_true", help="skip the in-process engine figures")
    parser.add_argument("--serve", action="store_true", help="start `batchproof serve` and measure it over HTTP")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra flag for the served engine")
    parser.add_argument("--url", help="measure this OpenAI-compatible server over HTTP")
    parser.add_argument("--vs", help="a peer server to measure with the same workload, for ratios")
    parser.add_argument("--vs-pid", type=int, help="the peer's process id, to report its peak resident memory")
    parser.add_argument("--concurrency", default="", help="HTTP concurrency ladder, e.g. 1,4,8,16,32")
    parser.add_argument("--band-repeats", type=int, default=3, help="runs per ladder rung (the median run is kept)")
    parser.add_argument("--invariance-cost", action="store_true",
                        help="also measure the invariant engine against plain torch at batch 1, 4, 8, 16")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="only measure the prefix cache: two servers (on and off), TTFT of a cached system "
                             "prompt, c=16 with distinct prompts, an lm-eval multiple-choice run")
    parser.add_argument("--fleet", action="store_true",
                        help="`batchproof fleet` (2 replicas x 1 thread) against one server: c=16, the Ray hop, memory")
    parser.add_argument("--structured", action="store_true",
                        help="only measure structured output: decode under a JSON schema against free, c=1 and c=16")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- the engine, in process ----------------------------------------------------------------

def load_engine(args: argparse.Namespace):
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine

    # No prefix cache: the engine figures measure the arithmetic, and the prefill figure
    # repeats one prompt, which the cache would answer from memory.
    return Engine(EngineConfig(model_path=args.model, device="cpu", prefix_cache=False))


def engine_prefill(engine, args: argparse.Namespace) -> dict:
    from batchproof.engine.sampling_params import SamplingParams

    prefill_ids = engine.tokenizer.encode(PREFILL_TEXT)
    rates = []
    for i in range(args.repeats):
        started = time.perf_counter()
        engine.generate({f"p{i}": (prefill_ids, SamplingParams(temperature=0, max_tokens=1))})
        rates.append(len(prefill_ids) / (time.perf_counter() - started))
    return {"load_s": engine.load_time_s, "info": engine.info(), "prefill_tokens": len(prefill_ids),
            "prefill_tok_s": _median(rates)}


def engine_decode_rate(engine, args: argparse.Namespace, top_logprobs: int | None) -> float:
    """One greedy request alone: its decode steps (after the prefill step) per second."""
    from batchproof.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, top_logprobs=top_logprobs)
    engine.add_request("bench", engine.chat_prompt_ids([{"role": "user", "content": args.prompt}]), params)
    engine.step()
    started = time.perf_counter()
    while engine.has_work():
        engine.step()
    engine.take_batch_summary()
    return (args.max_tokens - 1) / (time.perf_counter() - started)


# --- servers, over HTTP ----------------------------------------------------------------------

def _body(args: argparse.Namespace, model: str | None, top_logprobs: int | None) -> dict:
    body = {"messages": [{"role": "user", "content": args.prompt}], "max_tokens": args.max_tokens,
            "temperature": 0, "seed": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if top_logprobs is not None:
        body |= {"logprobs": True, "top_logprobs": top_logprobs}
    return body


async def _band(url: str, body: dict, c: int) -> dict:
    from batchproof.probe.stream import StreamRequest, fire

    request = StreamRequest(url=f"{url}/v1/chat/completions", body=body, headers={}, timeout_s=900)
    started = time.perf_counter()
    results = await asyncio.gather(*(fire(request) for _ in range(c)))
    wall = time.perf_counter() - started
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError(f"{url}: {errors[0]}")
    # Every server is timed from its own chunk arrivals (the probe times only `live` streams).
    rates = [(r.completion_tokens - 1) / (r.arrivals[-1] - r.arrivals[0])
             for r in results if r.completion_tokens and len(r.arrivals) >= 2 and r.arrivals[-1] > r.arrivals[0]]
    return {
        "c": c,
        "aggregate_tok_s": sum(r.completion_tokens or 0 for r in results) / wall,
        "per_request_tok_s": _median(rates),
        "ttft_s": _median([r.arrivals[0] for r in results]),
    }


def median_band(url: str, body: dict, c: int, repeats: int) -> dict:
    """The run with the median aggregate rate among `repeats` runs of one rung."""
    runs = sorted((asyncio.run(_band(url, body, c)) for _ in range(max(1, repeats))),
                  key=lambda band: band["aggregate_tok_s"])
    return runs[len(runs) // 2] | {"runs": len(runs)}


def served_model(url: str) -> str | None:
    import httpx

    models = httpx.get(f"{url}/v1/models", timeout=30).json().get("data") or [{}]
    return models[0].get("id")


def http_ttft(url: str, model: str | None, key: str, round_number: list[int]) -> float:
    """Time to first token of a ~600-token prompt, streamed, alone. Each call's prompt opens
    with a different word, so no server can answer from a prompt cache."""
    round_number[0] += 1
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
    opening = " ".join(words[int(d)] for d in str(round_number[0]))
    body = {"messages": [{"role": "user", "content": f"{opening}. {LONG_PROMPT}"}], "max_tokens": 1,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    if key == "peer":
        body["cache_prompt"] = False  # llama-server's own prompt cache, off
    return asyncio.run(_band(url, body, 1))["ttft_s"]


def http_decode_rate(url: str, model: str | None, args: argparse.Namespace, top_logprobs: int | None) -> float:
    return asyncio.run(_band(url, _body(args, model, top_logprobs), 1))["per_request_tok_s"]


def single_stream(measurements: dict, repeats: int) -> dict:
    """Median of each measurement, taken in interleaved rounds (A, B, C, A, B, C, ...) so a
    slow minute of a shared machine hits every figure alike."""
    runs: dict = {label: [] for label in measurements}
    for _ in range(repeats):
        for label, measure in measurements.items():
            runs[label].append(measure())
    return {label: {"median": _median(values), "runs": values} for label, values in runs.items()}


def healthy(url: str) -> bool:
    import httpx

    return httpx.get(f"{url}/health", timeout=5).status_code == 200


def start_batchproof(command: list[str], ready: Callable[[str], bool] = healthy, timeout_s: float = 120
                     ) -> tuple[subprocess.Popen, str]:
    """`batchproof <command> --port P` in its own process, once `ready(url)` -> (process, url)."""
    import httpx

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="batchproof-bench-", suffix=".log", delete=False)
    process = subprocess.Popen([sys.executable, "-m", "batchproof", *command, "--port", str(port)], stdout=log,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if ready(url):
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"batchproof {' '.join(command)} did not come up; see {log.name}")


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    model = ["--model", str(args.model)] if args.model else []
    return start_batchproof(["serve", *args.serve_arg, *model])


# --- report ----------------------------------------------------------------------------------

def report(results: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    engine = results.get("engine")
    if engine:
        table = Table(title="engine (in process, CPU float32)")
        for column in ("load s", "prefill tok/s", "decode tok/s", "decode top-20 tok/s", "peak RSS MB"):
            table.add_column(column, justify="right")
        table.add_row(f"{engine['load_s']:.2f}", f"{engine['prefill_tok_s']:.0f}", f"{engine['decode_tok_s']:.1f}",
                      f"{engine['decode_top20_tok_s']:.1f}", f"{engine['peak_rss_mb']:.0f}")
        console.print(table)
    for key in ("ours", "peer"):
        figures = results.get(key)
        if not figures:
            continue
        table = Table(title=f"{key}: {figures['url']} ({figures['model']})")
        for column in ("c", "aggregate tok/s", "per-request tok/s", "TTFT s"):
            table.add_column(column, justify="right")
        table.add_row("1 (stream)", "", f"{figures['decode_tok_s']:.1f}", "")
        table.add_row("1 (top-20)", "", f"{figures['decode_top20_tok_s']:.1f}", "")
        for band in figures["bands"]:
            table.add_row(str(band["c"]), f"{band['aggregate_tok_s']:.1f}", f"{band['per_request_tok_s']:.1f}",
                          f"{band['ttft_s']:.3f}")
        console.print(table)
    for line in ratios(results):
        console.print(line)
    if results.get("invariance_cost"):
        from batchproof.commands.invariance_cost import table as cost_table

        console.print("decode throughput, invariant engine vs plain torch (engine, in process):")
        console.print(cost_table(results["invariance_cost"]), markup=False)


def _paired_cost(base: list[float], other: list[float]) -> float:
    """Median over rounds of 1 - other/base: each pair ran back to back, so a slow minute of
    the machine cancels out of its ratio."""
    return _median([1 - b / a for a, b in zip(base, other)])


def ratios(results: dict) -> list[str]:
    lines = []
    engine, ours, peer = results.get("engine"), results.get("ours"), results.get("peer")
    if engine and ours:
        cost = _paired_cost(engine["decode_runs"][0], ours["decode_runs"][0])
        lines.append(f"HTTP cost (paired rounds): {cost:+.1%} "
                     f"(medians: engine {engine['decode_tok_s']:.1f}, HTTP {ours['decode_tok_s']:.1f} tok/s)")
    if engine:
        lines.append(f"logprobs cost (top_logprobs 20, engine, paired rounds): "
                     f"{_paired_cost(*engine['decode_runs']):+.1%}")
    if ours:
        lines.append(f"logprobs cost (top_logprobs 20, HTTP, paired rounds): "
                     f"{_paired_cost(*ours['decode_runs']):+.1%}")
        by_c = {b["c"]: b for b in ours.get("bands", [])}
        if 1 in by_c and 4 in by_c:
            share = by_c[4]["per_request_tok_s"] / by_c[1]["per_request_tok_s"]
            lines.append(f"per-request decode c=4 / c=1: {share:.0%}")
        if 1 in by_c and 16 in by_c:
            lines.append(f"aggregate c=16 / c=1: {by_c[16]['aggregate_tok_s'] / by_c[1]['aggregate_tok_s']:.1f}x")
    if ours and peer:
        share = 1 - _paired_cost(peer["decode_runs"][0], ours["decode_runs"][0])
        lines.append(f"single stream ours / peer (paired rounds): {share:.2f}")
        if "ttft_600_s" in ours and "ttft_600_s" in peer:
            ttft_ours, ttft_peer = ours["ttft_600_s"], peer["ttft_600_s"]
            lines.append(f"TTFT of a ~600-token prompt: ours {ttft_ours:.3f} s, peer {ttft_peer:.3f} s "
                         f"(ours/peer {ttft_ours / ttft_peer:.2f})")
        if ours.get("peak_rss_mb") and peer.get("peak_rss_mb"):
            lines.append(f"peak resident memory: ours {ours['peak_rss_mb']:.0f} MB, peer {peer['peak_rss_mb']:.0f} MB")
        peer_by_c = {b["c"]: b for b in peer.get("bands", [])}
        for band in ours.get("bands", []):
            other = peer_by_c.get(band["c"])
            if other:
                aggregate = band["aggregate_tok_s"] / other["aggregate_tok_s"]
                lines.append(f"c={band['c']}: aggregate ours/peer {aggregate:.2f}, "
                             f"per-request ours/peer {band['per_request_tok_s'] / other['per_request_tok_s']:.2f}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.prefix_cache:
        return run_prefix_cache(args)
    if args.fleet:
        return run_fleet(args)
    if args.structured:
        return run_structured(args)
    ladder = [int(c) for c in args.concurrency.split(",") if c.strip()]
    results: dict = {"machine": {"cpus": os.cpu_count(), "host": socket.gethostname()}}
    process = None
    try:
        url = args.url.rstrip("/") if args.url else None
        if args.serve:
            process, url = start_server(args)
        engine = None if args.no_engine else load_engine(args)
        targets = {"ours": url, "peer": args.vs.rstrip("/") if args.vs else None}
        models = {key: served_model(target) for key, target in targets.items() if target}
        measurements = {}
        if engine is not None:
            results["engine"] = engine_prefill(engine, args)
            measurements["engine"] = lambda: engine_decode_rate(engine, args, None)
            measurements["engine_top20"] = lambda: engine_decode_rate(engine, args, 20)
        for key, model in models.items():
            measurements[key] = lambda t=targets[key], m=model: http_decode_rate(t, m, args, None)
            measurements[f"{key}_top20"] = lambda t=targets[key], m=model: http_decode_rate(t, m, args, 20)
            measurements[f"{key}_ttft600"] = lambda t=targets[key], m=model, k=key, n=[0]: http_ttft(t, m, k, n)
        rounds = single_stream(measurements, args.repeats)
        for key in ("engine", *models):
            if key in rounds:
                figures = results.setdefault(key, {})
                figures["decode_tok_s"] = rounds[key]["median"]
                figures["decode_top20_tok_s"] = rounds[f"{key}_top20"]["median"]
                figures["decode_runs"] = [rounds[key]["runs"], rounds[f"{key}_top20"]["runs"]]
                if f"{key}_ttft600" in rounds:
                    figures["ttft_600_s"] = rounds[f"{key}_ttft600"]["median"]
        if engine is not None:
            results["engine"]["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            del engine
        if args.invariance_cost:
            from batchproof.commands import invariance_cost

            results["invariance_cost"] = invariance_cost.measure(args.model, args.prompt, args.max_tokens,
                                                                 args.repeats)
        for key, model in models.items():
            results[key] |= {"url": targets[key], "model": model,
                             "bands": [median_band(targets[key], _body(args, model, None), c, args.band_repeats)
                                       for c in ladder]}
        if process is not None:
            results["ours"]["peak_rss_mb"] = status_mb(process.pid, "VmHWM")
        if args.vs_pid and "peer" in results:
            results["peer"]["peak_rss_mb"] = status_mb(args.vs_pid, "VmHWM")
    except RuntimeError as e:
        print(f"batchproof bench: {e}", file=sys.stderr)
        return 1
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    report(results)
    results["ratios"] = ratios(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0


def _side_bench(args: argparse.Namespace, key: str, measure: Callable[[], dict], report: Callable[[dict], None]
                ) -> int:
    """A bench of its own servers (the prefix cache's, the fleet's): measure, print, save."""
    try:
        figures = measure()
    except RuntimeError as e:
        print(f"batchproof bench: {e}", file=sys.stderr)
        return 1
    report(figures)
    if args.json:
        args.json.write_text(json.dumps({key: figures}, indent=1, default=str) + "\n")
    return 0


def run_prefix_cache(args: argparse.Namespace) -> int:
    from batchproof.commands import prefix_cache_bench

    return _side_bench(args, "prefix_cache", lambda: prefix_cache_bench.measure(args, start_server, served_model),
                       prefix_cache_bench.report)


def run_structured(args: argparse.Namespace) -> int:
    from batchproof.commands import structured_bench

    return _side_bench(args, "structured", lambda: structured_bench.measure(args.model, args.max_tokens, args.repeats),
                       structured_bench.report)


def run_fleet(args: argparse.Namespace) -> int:
    from batchproof.commands import fleet_bench

    return _side_bench(args, "fleet", lambda: fleet_bench.measure(args), fleet_bench.report)
