"""What structured output costs: decode throughput of requests under a JSON schema against the
same requests free, at c=1 and c=16, interleaved in one run (`batchproof bench --structured`).

The schema asks for more tokens than a run decodes (an array of at least 50 objects with a
string and an integer), so every constrained request decodes the same number of steps as a
free one, inside JSON strings (the widest masks) and numbers alike. Also measured: the lazy grammar
`tool_choice: "auto"` runs under (two tools offered, the server's Hermes format: free text in
which any call begun must be valid), decoding the same free text as the free run. Also reported:
how long the engine thread waited for masks (the rest of the mask's work runs on the grammar
thread while the forward pass runs)."""

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


# tool_choice auto's grammar: two tools as an agent offers them.
TOOLS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                         "additionalProperties": False},
         "get_time": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"],
                      "additionalProperties": False}}


@dataclass
class StructuredRow:
    concurrency: int
    free_tok_s: float
    constrained_tok_s: float
    cost: float  # 1 - constrained / free
    mask_wait_ms_per_step: float
    # Under tool_choice auto's lazy grammar (None in results written before it was measured).
    auto_tools_tok_s: float | None = None
    auto_tools_cost: float | None = None
    auto_tools_mask_wait_ms_per_step: float | None = None


@dataclass
class StructuredFigures:
    model: str
    vocab: int
    max_tokens: int
    repeats: int
    rows: list[StructuredRow]


def _decode(engine, prompt_ids: list[int], concurrency: int, max_tokens: int, constraint) -> tuple[float, float]:
    """(decode tokens per second after the first step, seconds the engine waited for masks per step)."""
    from batchproof.engine.sampling.params import SamplingParams

    # Free text (free, or auto's grammar outside a call) may end anywhere: EOS is ignored so each run
    # decodes max_tokens; a JSON schema asking for 50 objects cannot end sooner anyway.
    params = SamplingParams(temperature=0, max_tokens=max_tokens, constraint=constraint,
                            ignore_eos=constraint is None or constraint.kind == "tool_call")
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
    from batchproof.engine.sampling.constraint import Constraint
    from batchproof.server.tools.formats import HERMES

    engine = in_process.load_engine(model, max_batch=max(CONCURRENCY), prefix_cache=False)
    constraints = {"free": None, "json_schema": grammars.json_schema(SCHEMA),
                   "auto_tools": Constraint("tool_call", HERMES.grammar(TOOLS, True))}
    for one in constraints.values():
        if one is not None:
            grammars.check(one, engine.tokenizer)
    prompt_ids = engine.chat_prompt_ids([{"role": "user", "content": PROMPT}])
    for one in constraints.values():  # warm up: the first steps of a process page in the weights
        _decode(engine, prompt_ids, 1, 8, one)
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(repeats):  # interleaved: a slow minute of the machine hits all alike
        for concurrency in CONCURRENCY:
            for name, one in constraints.items():
                runs.setdefault((name, concurrency), []).append(
                    _decode(engine, prompt_ids, concurrency, max_tokens, one))

    def rate(name: str, concurrency: int) -> float:
        return median([r for r, _ in runs[name, concurrency]])

    def wait_ms(name: str, concurrency: int) -> float:
        return median([w for _, w in runs[name, concurrency]]) * 1e3

    rows = []
    for c in CONCURRENCY:
        free = rate("free", c)
        rows.append(StructuredRow(
            concurrency=c, free_tok_s=free, constrained_tok_s=rate("json_schema", c),
            cost=1 - rate("json_schema", c) / free, mask_wait_ms_per_step=wait_ms("json_schema", c),
            auto_tools_tok_s=rate("auto_tools", c), auto_tools_cost=1 - rate("auto_tools", c) / free,
            auto_tools_mask_wait_ms_per_step=wait_ms("auto_tools", c)))
    return StructuredFigures(model=str(engine.model_path.name), vocab=engine.tokenizer.vocab_size,
                             max_tokens=max_tokens, repeats=repeats, rows=rows)


def report(figures: StructuredFigures) -> None:
    print(f"structured output on {figures.model} ({figures.vocab} tokens), {figures.max_tokens} tokens "
          f"per request, median of {figures.repeats}:")
    print("| c | free | json_schema | cost | wait for masks | auto (tools) | cost | wait for masks |")
    print("|---|---|---|---|---|---|---|---|")
    for row in figures.rows:
        auto = ("| not measured | | |" if row.auto_tools_tok_s is None else
                f"| {row.auto_tools_tok_s:.1f} tok/s | {row.auto_tools_cost:+.1%} | "
                f"{row.auto_tools_mask_wait_ms_per_step:.2f} ms/step |")
        print(f"| {row.concurrency} | {row.free_tok_s:.1f} tok/s | {row.constrained_tok_s:.1f} tok/s | "
              f"{row.cost:+.1%} | {row.mask_wait_ms_per_step:.2f} ms/step {auto}")
