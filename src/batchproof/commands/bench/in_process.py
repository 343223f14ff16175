"""The engine measured in this process, without HTTP: loaded on the CPU, its prefill rate,
and the decode rate of a batch of greedy requests.

The engine (hence torch) is imported only when one is loaded, so a bench of servers over
HTTP alone runs without it."""

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchproof.commands.bench.figures import median
from batchproof.commands.flags import add_dataclass_arguments, dataclass_from_args

PREFILL_TEXT = ("Compilers translate programs written in one language into another, checking them, "
                "optimising them and emitting code a machine can run. ") * 24


@dataclass
class Prefill:
    num_tokens: int
    tok_s: float


def load_engine(model: Path | None, serve_args: Sequence[str] = (), **config: Any):
    """An Engine on the CPU from `model` (a GGUF file or a packaged name; None: the default),
    with the engine flags among `serve_args` (what the bench passes `batchproof serve`: so the
    engine measured in process runs the numerics, weights and speculation of the one measured
    over HTTP; server flags are ignored); `config`: EngineConfig fields over both."""
    from batchproof.engine.engine import Engine

    return Engine(engine_config(serve_args, model_path=model, device="cpu", **config))


def engine_config(serve_args: Sequence[str], **overrides: Any):
    """An EngineConfig from the engine flags among `serve_args` (parsed as `serve` parses them),
    then `overrides`."""
    from batchproof.engine.config import EngineConfig

    parser = argparse.ArgumentParser(add_help=False)
    add_dataclass_arguments(parser, EngineConfig)
    known, _ = parser.parse_known_args(list(serve_args))
    return dataclass_from_args(EngineConfig, known, **overrides)


def prefill(engine, repeats: int) -> Prefill:
    """A ~600-token prompt prefilled `repeats` times (one token decoded each): the median rate."""
    from batchproof.engine.sampling.params import SamplingParams

    prefill_ids = engine.tokenizer.encode(PREFILL_TEXT)
    rates = []
    for i in range(repeats):
        started = time.perf_counter()
        engine.generate({f"p{i}": (prefill_ids, SamplingParams(temperature=0, max_tokens=1))})
        rates.append(len(prefill_ids) / (time.perf_counter() - started))
    return Prefill(num_tokens=len(prefill_ids), tok_s=median(rates))


def decode_rate(engine, prompt_ids: list[int], max_tokens: int, batch: int = 1, top_logprobs: int | None = None
                ) -> float:
    """`batch` greedy requests decoded together: decode tokens per second after the step that
    prefills them (and gives each its first token)."""
    from batchproof.engine.sampling.params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, top_logprobs=top_logprobs)
    for i in range(batch):
        engine.add_request(f"bench-{i}", prompt_ids, params)
    engine.step()
    started = time.perf_counter()
    while engine.has_work():
        engine.step()
    engine.take_batch_summary()
    return batch * (max_tokens - 1) / (time.perf_counter() - started)
