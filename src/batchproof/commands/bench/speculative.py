"""What speculative decoding buys and costs, over HTTP: two servers started side by side
(`batchproof serve`, speculating, and `--no-speculative`), and a peer with `--vs`, measured in
interleaved rounds on three workloads at c=1 and c=16 (`batchproof bench --speculative`;
docs/speculative.md quotes its figures):

- editing: a ~300-token text asked back with one change (the reply copies the prompt);
- extraction: a JSON object from a passage, under a JSON schema;
- chat: free text (few drafts accepted: the cost of trying).

c=1 reports the stream's decode rate (from its chunk arrivals, after the first), c=16 the
aggregate rate (every completion token over the band's wall time). Each round's prompts open
with words of their own, so no prefix cache answers them across rounds.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from batchproof.commands.bench import http, servers
from batchproof.commands.bench.figures import median

TEXT = ("The old harbour town wakes before the sun. Fishing boats slip out past the breakwater while the "
        "bakery on Quay Street lights its ovens, and the smell of bread drifts over the water. By seven the "
        "market stalls are up: crates of mackerel and crab, baskets of samphire, a man selling rope and "
        "lanterns who has sold rope and lanterns from the same corner for forty years. The ferry to the "
        "island leaves at half past eight, and on summer mornings the queue for it stretches past the "
        "chandlery and the harbour master's office. Children sit on the sea wall with lines and buckets, "
        "hoping for a crab big enough to show their parents. In the afternoon the tide goes out and the "
        "boats lean on their keels in the mud, and the gulls walk among them looking for scraps. When the "
        "boats come back in the evening the whole town seems to come down to the quay to watch them unload, "
        "to argue about the weather and to buy the last of the fish at half the morning's price.")
WORKLOADS = {
    "editing": {"content": f"Return this text exactly as it is, but with 'forty years' changed to 'fifty "
                           f"years'. Write nothing else.\n\n{TEXT}", "max_tokens": 400},
    "extraction": {"content": f"Read the passage and give, as JSON, the street of the bakery, the ferry's "
                              f"departure time, how long the rope seller has been there, and a one-sentence "
                              f"summary quoting the passage.\n\n{TEXT}", "max_tokens": 200,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "harbour", "schema": {
                       "type": "object", "additionalProperties": False,
                       "required": ["bakery_street", "ferry_time", "rope_seller_years", "summary"],
                       "properties": {"bakery_street": {"type": "string"}, "ferry_time": {"type": "string"},
                                      "rope_seller_years": {"type": "integer"}, "summary": {"type": "string"}}}}}},
    "chat": {"content": "Write a short story about a girl who builds a kite and flies it from a cliff.",
             "max_tokens": 128, "ignore_eos": True},
}
CONCURRENCY = (1, 16)
# The two servers, as the figures name them, and the flags that make each.
SERVERS = {"speculative": [], "plain": ["--no-speculative"]}


@dataclass
class SpeculativeRow:
    workload: str
    c: int
    tok_s: dict[str, float]  # server -> c=1: the stream's decode rate; c=16: the aggregate rate
    speculative_over_plain: float = field(init=False)
    speculative_over_peer: float | None = field(init=False)

    def __post_init__(self) -> None:
        self.speculative_over_plain = self.tok_s["speculative"] / self.tok_s["plain"]
        self.speculative_over_peer = self.tok_s["speculative"] / self.tok_s["peer"] if "peer" in self.tok_s else None


@dataclass
class SpeculativeFigures:
    repeats: int
    rows: list[SpeculativeRow]
    acceptance: dict[str, float]  # the speculating server's accepted / drafted tokens, over the run


def _body(workload: str, round_number: int, model: str | None) -> dict:
    spec = dict(WORKLOADS[workload])
    content = f"({http.opening(round_number)}) {spec.pop('content')}"
    body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **spec}
    return body | ({"model": model} if model else {})


def _rate(url: str, body: dict, c: int) -> float:
    if c == 1:
        return http.decode_rate(url, body)
    return http.band(url, body, c).aggregate_tok_s


def _acceptance(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {name: float(m.group(1)) for name in ("draft", "accepted")
             if (m := re.search(rf"^batchproof_speculative_{name}_tokens_total (\S+)$", text, re.MULTILINE))}
    return found | ({"ratio": found["accepted"] / found["draft"]} if found.get("draft") else {})


def measure(model: Path | None, serve_args: list[str], repeats: int, peer: str | None,
            concurrency: tuple[int, ...] = CONCURRENCY) -> SpeculativeFigures:
    """Both servers up at once (one idles while the other is measured), rounds interleaved."""
    started = {}
    try:
        for name, flags in SERVERS.items():
            started[name] = servers.start_serve(model, [*serve_args, *flags])
        urls = {name: url for name, (_, url) in started.items()} | ({"peer": peer} if peer else {})
        models = {name: http.served_model(url) for name, url in urls.items()}
        for name, url in urls.items():  # warm up: the first steps of a process page in the weights
            _rate(url, _body("chat", 0, models[name]) | {"max_tokens": 8}, 1)
        runs: dict[tuple[str, int, str], list[float]] = {}
        for r in range(repeats):
            for workload in WORKLOADS:
                for c in concurrency:
                    for name, url in urls.items():
                        body = _body(workload, 100 * r + 10 * c + len(workload), models[name])
                        runs.setdefault((workload, c, name), []).append(_rate(url, body, c))
        rows = [SpeculativeRow(workload, c, {name: median(runs[workload, c, name]) for name in urls})
                for workload in WORKLOADS for c in concurrency]
        return SpeculativeFigures(repeats=repeats, rows=rows, acceptance=_acceptance(urls["speculative"]))
    finally:
        servers.stop(process for process, _ in started.values())


def report(figures: SpeculativeFigures) -> None:
    has_peer = any(row.speculative_over_peer is not None for row in figures.rows)
    print(f"speculative decoding (two servers{' and the peer' if has_peer else ''}, interleaved rounds, "
          f"median of {figures.repeats}; c=1: the stream's decode rate, c=16: aggregate):")
    print("| workload | c | speculative | plain | on/off |" + (" peer | ours/peer |" if has_peer else ""))
    print("|---|---|---|---|---|" + ("---|---|" if has_peer else ""))
    for row in figures.rows:
        line = (f"| {row.workload} | {row.c} | {row.tok_s['speculative']:.1f} tok/s | {row.tok_s['plain']:.1f} tok/s "
                f"| {row.speculative_over_plain:.2f}x |")
        if has_peer:
            line += f" {row.tok_s['peer']:.1f} tok/s | {row.speculative_over_peer:.2f}x |"
        print(line)
    if "ratio" in figures.acceptance:
        a = figures.acceptance
        print(f"  drafted tokens accepted: {a['accepted']:.0f} of {a['draft']:.0f} ({a['ratio']:.0%})")
