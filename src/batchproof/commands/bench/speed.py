"""The default `batchproof bench`: load, prefill and decode speed of the engine in process, of
our server over HTTP and, with `--vs URL`, of a peer server measured with the same workload in
the same run, so ratios compare like with like on one machine."""

import argparse
import itertools
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from batchproof.commands.bench import http, in_process, invariance_cost, machine, roofline, servers
from batchproof.commands.bench.figures import median, save
from batchproof.commands.bench.http import Band
from batchproof.commands.bench.invariance_cost import InvarianceCost
from batchproof.commands.bench.roofline import Roofline


@dataclass
class EngineFigures:
    load_s: float
    info: dict[str, Any]
    prefill_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    decode_top20_tok_s: float
    decode_runs: list[list[float]]  # [plain, top-20 logprobs], one rate per round
    peak_rss_mb: float


@dataclass
class ServerFigures:
    decode_tok_s: float
    decode_top20_tok_s: float
    decode_runs: list[list[float]]  # [plain, top-20 logprobs], one rate per round
    ttft_600_s: float
    url: str
    model: str | None
    bands: list[Band] = field(default_factory=list)  # the concurrency ladder
    peak_rss_mb: float | None = None  # where the bench knows its process


@dataclass
class SpeedResults:
    machine: dict[str, Any]
    engine: EngineFigures | None = None
    ours: ServerFigures | None = None
    peer: ServerFigures | None = None
    invariance_cost: InvarianceCost | None = None
    roofline: Roofline | None = None  # with the engine: bytes and operations a step, the machine's limits
    ratios: list[str] = field(default_factory=list)


@dataclass
class SingleStream:
    """One target's single-stream measurements (each returns one figure), run once a round."""

    decode: Callable[[], float]
    decode_top20: Callable[[], float]
    ttft_600: Callable[[], float] | None = None  # over HTTP only


@dataclass
class Runs:
    decode: list[float] = field(default_factory=list)
    decode_top20: list[float] = field(default_factory=list)
    ttft_600: list[float] = field(default_factory=list)


def single_stream(streams: dict[str, SingleStream], repeats: int) -> dict[str, Runs]:
    """Every measurement in interleaved rounds (A, B, C, A, B, C, ...) so a slow minute of a
    shared machine hits every figure alike."""
    runs = {key: Runs() for key in streams}
    for _ in range(repeats):
        for key, stream in streams.items():
            runs[key].decode.append(stream.decode())
            runs[key].decode_top20.append(stream.decode_top20())
            if stream.ttft_600:
                runs[key].ttft_600.append(stream.ttft_600())
    return runs


def _engine_stream(engine, args: argparse.Namespace) -> SingleStream:
    prompt_ids = engine.chat_prompt_ids([{"role": "user", "content": args.prompt}])
    return SingleStream(decode=lambda: in_process.decode_rate(engine, prompt_ids, args.max_tokens),
                        decode_top20=lambda: in_process.decode_rate(engine, prompt_ids, args.max_tokens,
                                                                    top_logprobs=20))


def _http_stream(url: str, model: str | None, args: argparse.Namespace, is_peer: bool) -> SingleStream:
    plain, top20 = (http.chat_body(args.prompt, args.max_tokens, model, top) for top in (None, 20))
    rounds = itertools.count(1)  # each round's long prompt is new to the server
    return SingleStream(decode=lambda: http.decode_rate(url, plain), decode_top20=lambda: http.decode_rate(url, top20),
                        ttft_600=lambda: http.ttft_600(url, model, next(rounds), is_peer))


def _engine_figures(engine, prefill: in_process.Prefill, runs: Runs) -> EngineFigures:
    return EngineFigures(load_s=engine.load_time_s, info=engine.info(), prefill_tokens=prefill.num_tokens,
                         prefill_tok_s=prefill.tok_s, decode_tok_s=median(runs.decode),
                         decode_top20_tok_s=median(runs.decode_top20), decode_runs=[runs.decode, runs.decode_top20],
                         peak_rss_mb=servers.own_peak_rss_mb())


def _server_figures(runs: Runs, url: str, model: str | None) -> ServerFigures:
    return ServerFigures(decode_tok_s=median(runs.decode), decode_top20_tok_s=median(runs.decode_top20),
                         decode_runs=[runs.decode, runs.decode_top20], ttft_600_s=median(runs.ttft_600), url=url,
                         model=model)


def measure(args: argparse.Namespace, url: str | None, ladder: list[int]) -> SpeedResults:
    """The engine's, ours and the peer's single-stream figures in shared rounds (so the
    costs pair back-to-back runs), then the invariance cost, then each server's ladder."""
    results = SpeedResults(machine=machine.describe())
    targets = {key: target for key, target in (("ours", url), ("peer", args.vs and args.vs.rstrip("/"))) if target}
    models = {key: http.served_model(target) for key, target in targets.items()}
    # No prefix cache: the engine figures measure the arithmetic, and the prefill figure
    # repeats one prompt, which the cache would answer from memory.
    engine = None if args.no_engine else in_process.load_engine(args.model, args.serve_arg, prefix_cache=False)
    prefill = None if engine is None else in_process.prefill(engine, args.repeats)
    streams = {} if engine is None else {"engine": _engine_stream(engine, args)}
    for key, target in targets.items():
        streams[key] = _http_stream(target, models[key], args, is_peer=key == "peer")
    runs = single_stream(streams, args.repeats)
    if engine is not None:
        results.engine = _engine_figures(engine, prefill, runs["engine"])
        results.roofline = _roofline(engine, args)
    engine = streams = None  # the engine (its closures too) goes: the invariance cost loads two of its own
    results.ours, results.peer = (_server_figures(runs[key], targets[key], models[key]) if key in targets else None
                                  for key in ("ours", "peer"))
    if args.invariance_cost:
        results.invariance_cost = invariance_cost.measure(args.model, args.prompt, args.max_tokens, args.repeats,
                                                          args.serve_arg)
    for key, figures in (("ours", results.ours), ("peer", results.peer)):
        if figures is not None:
            body = http.chat_body(args.prompt, args.max_tokens, models[key])
            figures.bands = [http.median_band(targets[key], body, c, args.band_repeats) for c in ladder]
    if results.roofline is not None:
        _place_on_roofline(results.roofline, results)
    return results


def _roofline(engine, args: argparse.Namespace) -> Roofline:
    """The model's bytes a step and operations a token at the decode's mean context, and the
    machine's limits on the engine's threads (read bandwidth, FMA and int-dot peaks), measured now."""
    prompt = len(engine.chat_prompt_ids([{"role": "user", "content": args.prompt}]))
    return Roofline(roofline.footprint(engine, prompt + args.max_tokens // 2), roofline.limits(engine.num_threads),
                    engine.config.numerics)


def _place_on_roofline(line: Roofline, results: SpeedResults) -> None:
    """Our single stream (over HTTP when served, else the engine's) and our c=16 aggregate."""
    line.c1_tok_s = results.ours.decode_tok_s if results.ours else results.engine.decode_tok_s
    c16 = [band for band in (results.ours.bands if results.ours else []) if band.c == 16]
    line.c16_aggregate_tok_s = c16[0].aggregate_tok_s if c16 else None


def _engine_ratios(engine: EngineFigures, ours: ServerFigures | None) -> list[str]:
    lines = []
    if ours:
        cost = paired_cost(engine.decode_runs[0], ours.decode_runs[0])
        lines.append(f"HTTP cost (paired rounds): {cost:+.1%} "
                     f"(medians: engine {engine.decode_tok_s:.1f}, HTTP {ours.decode_tok_s:.1f} tok/s)")
    lines.append(f"logprobs cost (top_logprobs 20, engine, paired rounds): {paired_cost(*engine.decode_runs):+.1%}")
    return lines


def _ladder_ratios(ours: ServerFigures) -> list[str]:
    lines = [f"logprobs cost (top_logprobs 20, HTTP, paired rounds): {paired_cost(*ours.decode_runs):+.1%}"]
    by_c = {band.c: band for band in ours.bands}
    if 1 in by_c and 4 in by_c:
        lines.append(f"per-request decode c=4 / c=1: {by_c[4].per_request_tok_s / by_c[1].per_request_tok_s:.0%}")
    if 1 in by_c and 16 in by_c:
        lines.append(f"aggregate c=16 / c=1: {by_c[16].aggregate_tok_s / by_c[1].aggregate_tok_s:.1f}x")
    return lines


def _peer_ratios(ours: ServerFigures, peer: ServerFigures) -> list[str]:
    lines = [f"single stream ours / peer (paired rounds): "
             f"{1 - paired_cost(peer.decode_runs[0], ours.decode_runs[0]):.2f}",
             f"TTFT of a ~600-token prompt: ours {ours.ttft_600_s:.3f} s, peer {peer.ttft_600_s:.3f} s "
             f"(ours/peer {ours.ttft_600_s / peer.ttft_600_s:.2f})"]
    if ours.peak_rss_mb and peer.peak_rss_mb:
        lines.append(f"peak resident memory: ours {ours.peak_rss_mb:.0f} MB, peer {peer.peak_rss_mb:.0f} MB")
    peer_by_c = {band.c: band for band in peer.bands}
    for band in ours.bands:
        other = peer_by_c.get(band.c)
        if other:
            lines.append(f"c={band.c}: aggregate ours/peer {band.aggregate_tok_s / other.aggregate_tok_s:.2f}, "
                         f"per-request ours/peer {band.per_request_tok_s / other.per_request_tok_s:.2f}")
    return lines


def paired_cost(base: list[float], other: list[float]) -> float:
    """Median over rounds of 1 - other/base: each pair ran back to back, so a slow minute of
    the machine cancels out of its ratio."""
    return median([1 - b / a for a, b in zip(base, other)])


def ratios(results: SpeedResults) -> list[str]:
    """The costs and ratios the figures imply, one line each, after the machine they ran on."""
    lines = [machine.line(results.machine)] if "cpu" in results.machine else []  # older files: no CPU named
    if results.engine:
        lines += _engine_ratios(results.engine, results.ours)
    if results.ours:
        lines += _ladder_ratios(results.ours)
    if results.ours and results.peer:
        lines += _peer_ratios(results.ours, results.peer)
    if results.roofline:
        lines += results.roofline.lines()
    return lines


def report(results: SpeedResults) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    engine = results.engine
    if engine:
        table = Table(title="engine (in process, CPU float32)")
        for column in ("load s", "prefill tok/s", "decode tok/s", "decode top-20 tok/s", "peak RSS MB"):
            table.add_column(column, justify="right")
        table.add_row(f"{engine.load_s:.2f}", f"{engine.prefill_tok_s:.0f}", f"{engine.decode_tok_s:.1f}",
                      f"{engine.decode_top20_tok_s:.1f}", f"{engine.peak_rss_mb:.0f}")
        console.print(table)
    for key, figures in (("ours", results.ours), ("peer", results.peer)):
        if not figures:
            continue
        table = Table(title=f"{key}: {figures.url} ({figures.model})")
        for column in ("c", "aggregate tok/s", "per-request tok/s", "TTFT s"):
            table.add_column(column, justify="right")
        table.add_row("1 (stream)", "", f"{figures.decode_tok_s:.1f}", "")
        table.add_row("1 (top-20)", "", f"{figures.decode_top20_tok_s:.1f}", "")
        for band in figures.bands:
            table.add_row(str(band.c), f"{band.aggregate_tok_s:.1f}", f"{band.per_request_tok_s:.1f}",
                          f"{band.ttft_s:.3f}")
        console.print(table)
    for line in ratios(results):
        console.print(line)
    if results.invariance_cost:
        console.print("decode throughput, invariant engine vs plain torch (engine, in process):")
        console.print(invariance_cost.table(results.invariance_cost), markup=False)


def run(args: argparse.Namespace) -> int:
    ladder = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not ladder and args.vs:
        ladder = [16]  # against a peer: c=1 (the single stream), c=16 and memory, side by side
    process = None
    try:
        url = args.url.rstrip("/") if args.url else None
        if args.serve:
            process, url = servers.start_serve(args.model, args.serve_arg)
        results = measure(args, url, ladder)
        if process is not None:
            results.ours.peak_rss_mb = servers.peak_rss_mb(process.pid)
        if args.vs_pid and results.peer:
            results.peer.peak_rss_mb = servers.peak_rss_mb(args.vs_pid)
    except RuntimeError as e:
        print(f"batchproof bench: {e}", file=sys.stderr)
        return 1
    finally:
        if process is not None:
            servers.stop([process])
    report(results)
    results.ratios = ratios(results)
    if args.json:
        save(args.json, results)
    return 0
