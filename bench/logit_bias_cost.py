"""What a full-vocabulary logit_bias costs a decode step (the engine alone, the default model).

    python bench/logit_bias_cost.py [--seqs 16] [--tokens 48] [--rounds 3]

Runs --seqs greedy sequences of --tokens tokens together, without a bias and with a bias of
0.0 on every token of the vocabulary (which changes no bit), interleaved --rounds times, and
reports the median decode-step time of each and their ratio (the target: under 1.05). For
scale, it also times the per-entry Python loop that applied a bias before (one row).
"""

import argparse
import statistics
import time

import torch

from batchproof.engine.config import EngineConfig
from batchproof.engine.engine import Engine
from batchproof.engine.sampling.params import SamplingParams


def step_times(engine: Engine, prompt: list[int], seqs: int, params: SamplingParams) -> list[float]:
    for i in range(seqs):
        engine.add_request(f"r{i}", prompt, params)
    times = []
    while engine.has_work():
        decoding = bool(engine.scheduler.running) and not any(s.is_prefilling for s in engine.scheduler.running)
        started = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - started)
    engine.take_batch_summary()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = Engine(EngineConfig(device="cpu"))
    vocab = engine.tokenizer.vocab_size
    prompt = engine.chat_prompt_ids([{"role": "user", "content": "Tell me about the sea."}])
    plain = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, cache_namespace=None)
    biased = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True, cache_namespace=None,
                            logit_bias=dict.fromkeys(range(vocab), 0.0))
    medians: dict[str, list[float]] = {"plain": [], "biased": []}
    for _ in range(args.rounds):
        for name, params in (("plain", plain), ("biased", biased)):
            medians[name].append(statistics.median(step_times(engine, prompt, args.seqs, params)))
    plain_s, biased_s = statistics.median(medians["plain"]), statistics.median(medians["biased"])
    row = torch.randn(vocab)
    started = time.perf_counter()
    for token_id, value in biased.logit_bias.items():  # how the bias was applied before
        row[token_id] += value
    loop_s = time.perf_counter() - started
    print(f"decode step, {args.seqs} sequences: {plain_s * 1000:.1f} ms plain, {biased_s * 1000:.1f} ms with a "
          f"{vocab}-entry bias on each: {biased_s / plain_s:.3f}x")
    print(f"the per-entry loop it replaced: {loop_s * 1000:.0f} ms per sequence per step "
          f"({loop_s * args.seqs / plain_s:.0f}x a whole step at {args.seqs} sequences)")


if __name__ == "__main__":
    main()
