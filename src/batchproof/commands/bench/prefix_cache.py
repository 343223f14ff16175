"""What the prefix cache buys and costs, over HTTP: two servers started side by side (cache
on, and `--no-prefix-cache`), measured in interleaved rounds. Used by
`batchproof bench --prefix-cache`; docs/prefix-cache.md quotes its figures.

- TTFT of a request whose ~1,000-token system prompt is cached, against the same request
  cold (each round's system prompt opens with its own words, so it is new to the server);
- aggregate decode at c=16 with 16 distinct prompts (nothing shared: the bookkeeping alone);
- 16 requests at once sharing that cached system prompt (an agent's tools, an evaluation's
  instructions): their wall time, and the prompt tokens each was served from the cache;
- lm-evaluation-harness's multiple-choice run (four continuations of one ~500-token
  context, bench/tasks/) on each server: wall time, and whether every log-likelihood is equal.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchproof.commands.bench import http, servers
from batchproof.commands.bench.figures import median

SYSTEM = ("You are the reference desk of a maritime museum. Visitors ask about ships, charts, instruments, "
          "voyages and the people who sailed them. Answer in one or two sentences, name the gallery where "
          "the object can be seen, and say when you are not sure. ") * 20
QUESTIONS = ("What is an astrolabe?", "Where is the captain's log kept?")
ROOT = Path(__file__).resolve().parents[4]
# The two servers, as the figures name them, and the flags that make each.
SERVERS = {"cache": [], "no_cache": ["--no-prefix-cache"]}


@dataclass
class TtftRuns:
    cold: list[float] = field(default_factory=list)
    cached: list[float] = field(default_factory=list)


@dataclass
class LmEvalFigures:
    wall_s: dict[str, float]  # server -> seconds
    speedup: float  # without the cache / with it
    loglikelihoods: int
    identical: bool  # every log-likelihood the same on both servers


@dataclass
class PrefixCacheFigures:
    """Built from the runs (`ttft_runs`, `c16_runs`: server -> one rate per round) and lm-eval's
    figures (or why there are none); the medians and ratios follow from them."""

    ttft_cold_s: float = field(init=False)
    ttft_cached_s: float = field(init=False)
    ttft_runs: TtftRuns
    c16_distinct_tok_s: dict[str, float] = field(init=False)
    c16_runs: dict[str, list[float]]
    ttft_cached_over_cold: float = field(init=False)
    c16_cache_over_no_cache: float = field(init=False)
    lm_eval: LmEvalFigures | str
    # 16 at once sharing a cached system prompt: server -> (wall seconds, median cached prompt
    # tokens) per round; absent from runs before the band existed.
    shared_runs: dict[str, list[list[float]]] | None = None
    shared_c16_wall_s: dict[str, float] | None = field(init=False)
    shared_c16_cached_tokens: dict[str, float] | None = field(init=False)

    def __post_init__(self) -> None:
        self.ttft_cold_s, self.ttft_cached_s = median(self.ttft_runs.cold), median(self.ttft_runs.cached)
        self.c16_distinct_tok_s = {name: median(runs) for name, runs in self.c16_runs.items()}
        self.ttft_cached_over_cold = self.ttft_cached_s / self.ttft_cold_s
        self.c16_cache_over_no_cache = self.c16_distinct_tok_s["cache"] / self.c16_distinct_tok_s["no_cache"]
        runs = self.shared_runs
        self.shared_c16_wall_s = None if runs is None else {n: median([r[0] for r in rs]) for n, rs in runs.items()}
        self.shared_c16_cached_tokens = None if runs is None else {n: median([r[1] for r in rs])
                                                                   for n, rs in runs.items()}


def _chat(system: str, question: str, max_tokens: int, model: str | None) -> dict:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    return body | ({"model": model} if model else {})


def ttft_pair(url: str, model: str | None, round_number: int) -> tuple[float, float]:
    """(cold, cached) time to first token: a new system prompt, then the same one again
    with another question."""
    system = f"{http.opening(round_number)}. {SYSTEM}"
    times = []
    for question in QUESTIONS:
        _, (result,) = http.fire_all(url, [_chat(system, question, 1, model)])
        times.append(result.arrivals[0])
    return times[0], times[1]


def distinct_band(url: str, model: str | None, round_number: int, c: int, max_tokens: int) -> float:
    """Aggregate tokens per second of c concurrent requests whose prompts share nothing."""
    # Each prompt opens with its own words in a system message of its own (without one, the
    # default model's template writes the same default system prompt before every prompt,
    # and the cache would serve that block to all of them).
    bodies = [_chat(f"{http.opening(i)}, {http.opening(round_number)}.", "Write about the sea.", max_tokens, model)
              for i in range(c)]
    wall, results = http.fire_all(url, bodies)
    return sum(r.completion_tokens or 0 for r in results) / wall


def shared_band(url: str, model: str | None, round_number: int, c: int, max_tokens: int) -> list[float]:
    """c requests at once after one that put their shared system prompt in the cache ->
    [wall seconds of the c, the median of their cached prompt tokens (0 where not said)]."""
    system = f"{http.opening(round_number)}. {SYSTEM}"
    http.fire_all(url, [_chat(system, "Hello.", 1, model)])
    bodies = [_chat(system, f"{http.opening(i)}: {QUESTIONS[i % 2]}", max_tokens, model) for i in range(c)]
    wall, results = http.fire_all(url, bodies)
    return [wall, median([float(r.cached_tokens or 0) for r in results])]


def lm_eval_run(url: str, out: Path) -> tuple[float, list[float]]:
    """lm-eval's local-completions on the bench task: wall seconds, every log-likelihood in order."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(out / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
               f"base_url={url}/v1/completions", "--tasks", "batchproof_prefix_mc", "--include_path", "bench/tasks",
               "--output_path", str(out / "results"), "--log_samples"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"lm_eval failed: {done.stderr[-2000:]}")
    values = []
    for path in sorted((out / "results").rglob("samples_*.jsonl")):
        for line in path.read_text().splitlines():
            sample = json.loads(line)
            values += [float(resp[0][0]) for resp in sample["resps"]]
    return wall, values


def _lm_eval(urls: dict[str, str]) -> LmEvalFigures | str:
    """lm-eval's multiple-choice run on each server, or why it cannot run."""
    try:
        import lm_eval  # noqa: F401  (the test extra)
    except ImportError:
        return "not installed (pip install -e '.[test]')"
    runs = {}
    for name in ("no_cache", "cache"):
        with tempfile.TemporaryDirectory() as out:
            runs[name] = lm_eval_run(urls[name], Path(out))
    return LmEvalFigures(wall_s={name: run[0] for name, run in runs.items()},
                         speedup=runs["no_cache"][0] / runs["cache"][0], loglikelihoods=len(runs["cache"][1]),
                         identical=runs["cache"][1] == runs["no_cache"][1])


def measure(model: Path | None, serve_args: list[str], max_tokens: int, repeats: int) -> PrefixCacheFigures:
    """Both servers up at once (one idles while the other is measured), rounds interleaved."""
    started = {}
    try:
        for name, flags in SERVERS.items():
            started[name] = servers.start_serve(model, [*serve_args, *flags])
        urls = {name: url for name, (_, url) in started.items()}
        models = {name: http.served_model(url) for name, url in urls.items()}
        ttft = TtftRuns()
        bands: dict[str, list[float]] = {name: [] for name in urls}
        shared: dict[str, list[list[float]]] = {name: [] for name in urls}
        for r in range(repeats):
            cold, cached = ttft_pair(urls["cache"], models["cache"], 1000 + r)
            ttft.cold.append(cold)
            ttft.cached.append(cached)
            for name in urls:
                bands[name].append(distinct_band(urls[name], models[name], 2000 + 2 * r + (name == "cache"), 16,
                                                 max_tokens))
            for name in urls:
                shared[name].append(shared_band(urls[name], models[name], 3000 + 2 * r + (name == "cache"), 16,
                                                max_tokens))
        return PrefixCacheFigures(ttft_runs=ttft, c16_runs=bands, lm_eval=_lm_eval(urls), shared_runs=shared)
    finally:
        servers.stop(process for process, _ in started.values())


def report(figures: PrefixCacheFigures) -> None:
    print("prefix cache (two servers, interleaved rounds):")
    print(f"  TTFT, ~1,000-token system prompt: cold {figures.ttft_cold_s * 1000:.0f} ms, cached "
          f"{figures.ttft_cached_s * 1000:.0f} ms ({figures.ttft_cached_over_cold:.1%} of cold)")
    c16 = figures.c16_distinct_tok_s
    print(f"  c=16, 16 distinct prompts: {c16['cache']:.1f} tok/s with the cache, {c16['no_cache']:.1f} without "
          f"({figures.c16_cache_over_no_cache:.3f}x)")
    if figures.shared_c16_wall_s is not None:
        wall, cached = figures.shared_c16_wall_s, figures.shared_c16_cached_tokens
        print(f"  c=16 sharing a cached system prompt: {wall['cache']:.2f} s with the cache ({cached['cache']:.0f} "
              f"prompt tokens cached each), {wall['no_cache']:.2f} s without ({wall['no_cache'] / wall['cache']:.2f}x)")
    lm = figures.lm_eval
    if isinstance(lm, LmEvalFigures):
        print(f"  lm-eval multiple choice ({lm.loglikelihoods} log-likelihoods): {lm.wall_s['no_cache']:.1f} s "
              f"without, {lm.wall_s['cache']:.1f} s with ({lm.speedup:.2f}x); identical: {lm.identical}")
    else:
        print(f"  lm-eval: {lm}")
