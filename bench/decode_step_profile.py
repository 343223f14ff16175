"""Where one decode step's time goes, single stream, in process: the layers (one C call on the
fused path), the LM head, the normaliser/top-k and greedy choice (outputs), and the rest
(scheduler, sequences, Python between steps). Run on a quiet machine:

    python bench/decode_step_profile.py [--model gemma3-270m] [--tokens 128] [--top-logprobs 5] [--streams 16]
        [--numerics int8] [--threads 1]

With --streams N, N requests decode together (the first steps, which prefill them, are not
counted).
"""

import argparse
import json
import statistics
import time
from collections import defaultdict

from batchproof.commands.bench import in_process
from batchproof.engine.sampling.params import SamplingParams


def timed(spent: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - started
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--top-logprobs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--numerics", default="float32", choices=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    engine = in_process.load_engine(args.model, prefix_cache=False, numerics=args.numerics, num_threads=args.threads)
    model, spent = engine.model, defaultdict(float)
    model.decode = timed(spent, "forward: layers + embedding", model.decode)
    model.logits = timed(spent, "LM head", model.logits)
    engine.outputs.process = timed(spent, "outputs: choice, records, text", engine.outputs.process)
    ids = engine.chat_prompt_ids([{"role": "user", "content": "Write an essay on compilers."}])
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, top_logprobs=args.top_logprobs)
    rows = []
    for r in range(args.repeats):
        spent.clear()
        for s in range(args.streams):
            engine.add_request(f"p{r}-{s}", ids, params)
        for _ in range(args.streams):  # the prefills and the first tokens
            engine.step()
        spent.clear()
        started = time.perf_counter()
        steps = 0
        while engine.has_work():
            engine.step()
            steps += 1
        total = time.perf_counter() - started
        row = {key: round(value / steps * 1e3, 3) for key, value in spent.items()}
        row["step (all)"] = round(total / steps * 1e3, 3)
        row["rest: scheduler, sequences, Python"] = round(row["step (all)"] - sum(v for k, v in row.items()
                                                                                    if k != "step (all)"), 3)
        rows.append(row)
    median = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    print(json.dumps({"model": str(engine.model_path.name), "numerics": args.numerics, "streams": args.streams,
                      "threads": engine.num_threads, "ms_per_step_median": median, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
