"""What batch invariance costs: decode throughput of the invariant engine against plain
torch (`--no-batch-invariant`) at several batch sizes, measured in one run, interleaved.
Used by `batchproof bench --invariance-cost`; docs/batch-invariance.md quotes its table."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from batchproof.commands.bench import in_process
from batchproof.commands.bench.figures import as_json, median

BATCHES = (1, 4, 8, 16)


@dataclass
class CostRow:
    batch: int
    invariant_tok_s: float
    torch_tok_s: float
    ratio: float


@dataclass
class InvarianceCost:
    rows: list[CostRow]
    decode_paths: dict[str, str]  # engine -> its decode path, as the engine names it
    max_tokens: int
    repeats: int

    def as_json(self) -> list[dict]:
        """The rows, then one entry of what they were measured with (the file's layout)."""
        return [as_json(row) for row in self.rows] + [
            {"decode_paths": self.decode_paths, "max_tokens": self.max_tokens, "repeats": self.repeats}]


def measure(model: Path | None, prompt: str, max_tokens: int, repeats: int,
            serve_args: Sequence[str] = ()) -> InvarianceCost:
    """Per batch size: the median decode rate of each engine (with the served engine's flags
    among `serve_args`, batch invariance on and off), each round interleaved so a slow minute
    of the machine hits both alike."""
    engines = {name: in_process.load_engine(model, serve_args, max_batch=max(BATCHES), is_batch_invariant=invariant)
               for name, invariant in (("invariant", True), ("torch", False))}
    prompt_ids = engines["invariant"].chat_prompt_ids([{"role": "user", "content": prompt}])
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for batch in BATCHES:
            for name, engine in engines.items():
                runs.setdefault((name, batch), []).append(in_process.decode_rate(engine, prompt_ids, max_tokens, batch))
    rows = []
    for batch in BATCHES:
        invariant, plain = (median(runs[name, batch]) for name in engines)
        rows.append(CostRow(batch=batch, invariant_tok_s=invariant, torch_tok_s=plain, ratio=invariant / plain))
    return InvarianceCost(rows=rows, decode_paths={name: e.info()["decode_path"] for name, e in engines.items()},
                          max_tokens=max_tokens, repeats=repeats)


def table(cost: InvarianceCost) -> str:
    """The markdown table docs/batch-invariance.md quotes."""
    lines = ["| batch | invariant | torch/MKL | ratio |", "|---|---|---|---|"]
    lines += [f"| {r.batch} | {r.invariant_tok_s:.0f} tok/s | {r.torch_tok_s:.0f} tok/s | {r.ratio:.1f}x |"
              for r in cost.rows]
    return "\n".join(lines)
