"""What batch invariance costs: decode throughput of the invariant engine against plain
torch (`--no-batch-invariant`) at several batch sizes, measured in one run, interleaved.
Used by `batchproof bench --invariance-cost`; docs/batch-invariance.md quotes its table."""

import statistics
import time
from pathlib import Path

BATCHES = (1, 4, 8, 16)


def _decode_rate(engine, prompt_ids: list[int], batch: int, max_tokens: int) -> float:
    """`batch` greedy requests decoded together: decode tokens per second after their prefill."""
    from batchproof.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"cost-{i}", prompt_ids, params)
    engine.step()  # every newcomer is prefilled in this step, and each gets its first token
    started = time.perf_counter()
    while engine.has_work():
        engine.step()
    engine.take_batch_summary()
    return batch * (max_tokens - 1) / (time.perf_counter() - started)


def measure(model: Path | None, prompt: str, max_tokens: int, repeats: int) -> list[dict]:
    """Per batch size: the median decode rate of each engine, each round interleaved so a
    slow minute of the machine hits both alike."""
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine

    engines = {name: Engine(EngineConfig(model_path=model, device="cpu", max_batch=max(BATCHES),
                                         is_batch_invariant=invariant))
               for name, invariant in (("invariant", True), ("torch", False))}
    prompt_ids = engines["invariant"].chat_prompt_ids([{"role": "user", "content": prompt}])
    runs: dict[tuple[str, int], list[float]] = {}
    for _ in range(repeats):
        for batch in BATCHES:
            for name, engine in engines.items():
                runs.setdefault((name, batch), []).append(_decode_rate(engine, prompt_ids, batch, max_tokens))
    rows = []
    for batch in BATCHES:
        invariant, plain = (statistics.median(runs[name, batch]) for name in engines)
        rows.append({"batch": batch, "invariant_tok_s": invariant, "torch_tok_s": plain, "ratio": invariant / plain})
    rows.append({"decode_paths": {name: e.info()["decode_path"] for name, e in engines.items()},
                 "max_tokens": max_tokens, "repeats": repeats})
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table docs/batch-invariance.md quotes."""
    lines = ["| batch | invariant | torch/MKL | ratio |", "|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['invariant_tok_s']:.0f} tok/s | {r['torch_tok_s']:.0f} tok/s | {r['ratio']:.1f}x |"
              for r in rows if "batch" in r]
    return "\n".join(lines)
