"""What structured output costs: decode throughput of requests under a JSON schema against the
same requests free, at c=1 and c=16, interleaved in one run (`batchproof bench --structured`).

The schema asks for more tokens than a run decodes (an array of at least 50 objects with a
string and an integer), so every constrained request decodes the same number of steps as a
free one, inside JSON strings (the widest masks) and numbers alike. Also reported: how long the
engine thread waited for masks (the rest of the mask's work runs on the grammar thread while
the forward pass runs)."""

import time
from dataclasses import dataclass
from pathlib import Path

from batchproof.commands.bench import in_process
from batchproof.commands.bench.figures import median

CONCURRENCY = (1, 16)
SCHEMA = {"type": "array", "minItems": 50,
          "items": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"], "additionalProperties": False}}
PROMPT = "List the people in the story with their ages, as JSON."


@dataclass
class StructuredRow:
    concurrency: int
    free_tok_s: float
    constrained_tok_s: float
    cost: float  # 1 - constrained / free
    mask_wait_ms_per_step: float


@dataclass
class StructuredFigures:
    model: str
    vocab: int
    max_tokens: int
    repeats: int
    rows: list[StructuredRow]


def _decode(engine, prompt_ids: list[int], concurrency: int, max_tokens: int, constraint) -> tuple[float, float]:
    """(decode tokens per second after the first step, seconds the engine waited for masks per step)."""
    from batchproof.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=constraint is None,
                            constraint=constraint)
    for i in range(concurrency):
        engine.add_request(f"structured-{i}", prompt_ids, params)
    engine.step()  # the prefill, and each request's first token (its grammar compiled meanwhile)
    waited = engine.outputs.grammar_wait_s
    started, steps = time.perf_counter(), 0
    while engine.has_work():
        outputs = engine.step()
        steps += 1
        errors = [o.error for o in outputs if o.finish_reason == "error"]
        if errors:
            raise RuntimeError(f"a constrained request failed: {errors[0]}")
    elapsed = time.perf_counter() - started
    engine.take_batch_summary()
    return concurrency * (max_tokens - 1) / elapsed, (engine.outputs.grammar_wait_s - waited) / max(steps, 1)


def measure(model: Path | None, max_tokens: int, repeats: int) -> StructuredFigures:
    from batchproof.engine.grammar import compile as grammars

    engine = in_process.load_engine(model, max_batch=max(CONCURRENCY), prefix_cache=False)
    constraint = grammars.json_schema(SCHEMA)
    grammars.check(constraint, engine.tokenizer)
    prompt_ids = engine.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    for one in (None, constraint):  # warm up: the first steps of a process page in the weights
        _decode(engine, prompt_ids, 1, 8, one)
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(repeats):  # interleaved: a slow minute of the machine hits both alike
        for concurrency in CONCURRENCY:
            for name, one in (("free", None), ("json_schema", constraint)):
                runs.setdefault((name, concurrency), []).append(
                    _decode(engine, prompt_ids, concurrency, max_tokens, one))
    rows = []
    for concurrency in CONCURRENCY:
        free = median([rate for rate, _ in runs["free", concurrency]])
        constrained = median([rate for rate, _ in runs["json_schema", concurrency]])
        wait = median([w for _, w in runs["json_schema", concurrency]])
        rows.append(StructuredRow(concurrency=concurrency, free_tok_s=free, constrained_tok_s=constrained,
                                  cost=1 - constrained / free, mask_wait_ms_per_step=wait * 1e3))
    return StructuredFigures(model=str(engine.model_path.name), vocab=engine.tokenizer.vocab_size,
                             max_tokens=max_tokens, repeats=repeats, rows=rows)


def report(figures: StructuredFigures) -> None:
    print(f"structured output on {figures.model} ({figures.vocab} tokens), {figures.max_tokens} tokens "
          f"per request, median of {figures.repeats}:")
    print("| c | free | json_schema | cost | engine's wait for masks |")
    print("|---|---|---|---|---|")
    for row in figures.rows:
        print(f"| {row.concurrency} | {row.free_tok_s:.1f} tok/s | {row.constrained_tok_s:.1f} tok/s | "
              f"{row.cost:+.1%} | {row.mask_wait_ms_per_step:.2f} ms/step |")
