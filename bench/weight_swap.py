"""What an in-flight (keep-mode) weight swap costs against today's drain (docs/weight-versions.md).

c requests, each a prompt of --prompt-tokens, generate --max-tokens greedily; once each has made
--swap-at tokens a second weights file (the default model's, its output norm scaled: the same
shapes) is swapped in, both ways, on one engine in this process:

- drain: the swap waits until every request in flight has finished, on the old weights
  (drain_s; the tokens made meanwhile are the stale policy's), then installs;
- keep: the swap installs at once; every sequence feeds its prompt and reply so far again under
  the new weights (refill_s: until each has made its next token; refill_tokens fed) and goes on.

Speculative decoding is off unless --speculative: these prompts cycle through a few words, so
prompt-lookup drafts would emit several tokens a step, and the first requests admitted would
finish before the last ones reach --swap-at (every request must be running at the swap).

Run it on quiet cores: python bench/weight_swap.py --concurrency 1,4,16 --json bench/results/weight-swap.json
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.sampling.params import SamplingParams

WORDS = "the sea at night is dark and the waves come in from far away under a sky of stars".split()


def changed_copy(model: Path, directory: Path) -> Path:
    """The model's file with its output norm scaled by 1.25: other weights, the same shapes."""
    path = directory / "changed.gguf"
    shutil.copyfile(model, path)
    reader = gguf.GGUFReader(path, "r+")
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    norm.data[:] = norm.data * np.float32(1.25)
    reader.data.flush()
    return path


def start(engine: Engine, c: int, prompt_tokens: int, max_tokens: int, swap_at: int) -> None:
    """c requests running, each with swap_at tokens made (the batch decoding together)."""
    for i in range(c):
        text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(prompt_tokens))
        ids = engine.tokenizer.encode(text, add_bos=False)[:prompt_tokens]
        engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    while min((len(s.output_ids) for s in engine.scheduler.running), default=0) < swap_at:
        engine.step()
    assert len(engine.scheduler.running) == c, "a request finished before the swap: see --speculative"


def drain(engine: Engine, prepared) -> dict:
    started = time.perf_counter()
    num_stale = 0
    while engine.has_work():
        num_stale += sum(len(out.token_ids) for out in engine.step())
    drain_s = time.perf_counter() - started
    engine.install_weights(prepared)
    return {"drain_s": round(drain_s, 4), "stale_tokens": num_stale,
            "total_s": round(time.perf_counter() - started, 4)}


def keep(engine: Engine, prepared) -> dict:
    started = time.perf_counter()
    made = {s.request_id: len(s.output_ids) for s in engine.scheduler.running}
    refill_tokens = sum(s.num_tokens for s in engine.scheduler.running)
    engine.install_weights(prepared, keep=True)
    installed = time.perf_counter()
    while any(len(s.output_ids) == made[s.request_id] for s in engine.scheduler.running if s.request_id in made):
        engine.step()
    refill_s = time.perf_counter() - installed
    while engine.has_work():
        engine.step()
    return {"install_s": round(installed - started, 4), "refill_s": round(refill_s, 4),
            "refill_tokens": refill_tokens, "refill_tokens_per_s": round(refill_tokens / refill_s, 1),
            "total_s": round(time.perf_counter() - started, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--swap-at", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--speculative", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    model = resolve_model(None)
    with tempfile.TemporaryDirectory() as directory:
        new_path = changed_copy(model, Path(directory))
        # Every prompt prefilled before any decoding (the whole budget for prefill, all prompts
        # in one or two steps), so the c requests reach --swap-at together and all run at the swap.
        engine = Engine(EngineConfig(device="cpu", max_batch=max(int(c) for c in args.concurrency.split(",")),
                                     speculative=args.speculative, prefill_share=1.0, max_prefill_tokens=4096))
        old, new = engine.prepare_weights(model), engine.prepare_weights(new_path)
        rows = []
        for c in (int(c) for c in args.concurrency.split(",")):
            for repeat in range(args.repeats):
                for mode, swap in (("drain", drain), ("keep", keep)):
                    engine.install_weights(old)
                    start(engine, c, args.prompt_tokens, args.max_tokens, args.swap_at)
                    row = {"concurrency": c, "mode": mode, "repeat": repeat, **swap(engine, new)}
                    engine.take_batch_summary()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    result = {"model": str(model), "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
              "swap_at": args.swap_at, "engine": engine.info(), "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
