"""How far the int8 numerics (--numerics int8) moves the model from the float32 path (issue 40).

For each packaged model: a fixed set of chat prompts, each continued greedily by the float32
engine; then every position of prompt + continuation scored by both numerics (one prefill each,
full logits). Reported per token: KL(float32 || int8) mean, p99 and max, and how often the two
agree on the top-1 token; over the continuations only and over every position. Then lm-eval's
multiple-choice run on the committed task (bench/tasks, nothing from the hub) through a
`batchproof serve` of each numerics: accuracy and the log-likelihoods' largest gap.

    python bench/int8_accuracy.py [--json bench/results/int8-accuracy.json] [--models smollm2-135m,gemma3-270m]

Nothing here is timed: any machine gives the same figures (the kernels' bits are the same on
every instruction set).
"""

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batchproof.commands.bench.prefix_cache import lm_eval_run  # noqa: E402
from batchproof.commands.bench.servers import start_serve, stop  # noqa: E402
from batchproof.engine.cache.kv_cache import KVCache  # noqa: E402
from batchproof.engine.config import EngineConfig  # noqa: E402
from batchproof.engine.engine import Engine  # noqa: E402
from batchproof.engine.model.transformer import Segment  # noqa: E402
from batchproof.engine.sampling.params import SamplingParams  # noqa: E402

PROMPTS = [
    "What is the capital of France?", "Write a short poem about the sea.", "Explain photosynthesis in two sentences.",
    "List three prime numbers.", "How do I reverse a list in Python?", "Translate 'good morning' into Spanish.",
    "What causes the seasons on Earth?", "Give me a recipe for pancakes.", "Who wrote Hamlet?",
    "Summarise the plot of Cinderella.", "What is 17 times 23?", "Describe a cat to someone who has never seen one.",
    "Write a haiku about autumn.", "What is a black hole?", "Name the planets of the solar system.",
    "Why is the sky blue?",
]
CONTINUATION = 48


@torch.inference_mode()
def position_logprobs(engine: Engine, ids: list[int]) -> torch.Tensor:
    s = engine.spec
    cache = KVCache(s.num_layers, 1, s.num_kv_heads, len(ids), s.head_dim, torch.device("cpu"), torch.float32)
    logits = engine.model.logits(engine.model.prefill([Segment(torch.tensor(ids), 0, 0)], cache))
    return torch.log_softmax(logits.double(), dim=-1)


def compare(model: str) -> dict:
    engines = {mode: Engine(EngineConfig(model_path=model, device="cpu", numerics=mode, max_batch=16))
               for mode in ("float32", "int8")}
    ref = engines["float32"]
    prompts = [ref.chat_prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=CONTINUATION, ignore_eos=True)
    out = ref.generate({str(i): (p, params) for i, p in enumerate(prompts)})
    kls, agree, kls_all, agree_all = [], [], [], []
    for i, prompt in enumerate(prompts):
        reply = [t for d in out[str(i)] for t in (d.token_ids or [])] or []
        ids = prompt + reply
        lp = {mode: position_logprobs(e, ids) for mode, e in engines.items()}
        kl = (lp["float32"].exp() * (lp["float32"] - lp["int8"])).sum(-1)  # per position
        top = lp["float32"].argmax(-1) == lp["int8"].argmax(-1)
        tail = slice(len(prompt) - 1, len(ids) - 1)  # the positions that predicted the continuation
        kls += kl[tail].tolist()
        agree += top[tail].tolist()
        kls_all += kl.tolist()
        agree_all += top.tolist()

    def summary(values: list[float], tops: list[bool]) -> dict:
        t = torch.tensor(values)
        return {"tokens": len(values), "kl_mean": t.mean().item(), "kl_p99": t.quantile(0.99).item(),
                "kl_max": t.max().item(), "top1_agreement": sum(tops) / len(tops)}

    return {"continuations": summary(kls, agree), "every_position": summary(kls_all, agree_all),
            "numerics": {mode: e.model.ops.numerics for mode, e in engines.items()}}


def lm_eval_both(model: str) -> dict:
    figures = {}
    for mode in ("float32", "int8"):
        process, url = start_serve(Path(model) if "/" in model else model, ["--numerics", mode])
        try:
            with tempfile.TemporaryDirectory() as out:
                _, values = lm_eval_run(url, Path(out))
                results = json.loads(next((Path(out) / "results").rglob("results_*.json")).read_text())
                acc = results["results"]["batchproof_prefix_mc"]["acc,none"]
            figures[mode] = {"acc": acc, "loglikelihoods": values}
        finally:
            stop([process])
    a, b = figures["float32"]["loglikelihoods"], figures["int8"]["loglikelihoods"]
    return {"task": "batchproof_prefix_mc (bench/tasks)", "acc": {m: f["acc"] for m, f in figures.items()},
            "loglikelihood_max_gap": max(abs(x - y) for x, y in zip(a, b, strict=True)), "choices": len(a)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--no-lm-eval", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {"machine": platform.processor() or platform.machine(), "models": {}}
    for model in args.models.split(","):
        figures = compare(model)
        if not args.no_lm_eval:
            figures["lm_eval"] = lm_eval_both(model)
        results["models"][model] = figures
        print(model, json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
