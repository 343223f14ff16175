"""`batchproof bench`: load, prefill and decode speed of the engine, and of servers over HTTP.

Every figure is measured in this run; `--vs URL` measures a peer server (llama.cpp's
llama-server, say) with the same workload right after ours, so ratios compare like
with like on one machine. A flag picks a bench of its own (`--prefix-cache`, `--fleet`,
`--structured`, `--speculative`), one module each here; `servers` starts what they measure and `http`
measures it, the same way for every bench. `--write-model PATH` writes a random-weight GGUF
in a larger model's shapes to measure on (`random_model`).
"""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_PROMPT = "Write an essay on compilers."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="GGUF file or packaged model name (default: smollm2-135m)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per decode measurement")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (the median is reported)")
    parser.add_argument("--no-engine", action="store_true", help="skip the in-process engine figures")
    parser.add_argument("--serve", action="store_true", help="start `batchproof serve` and measure it over HTTP")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra flag for the served engine; its engine flags (--numerics, --weights, "
                             "--no-speculative, ...) also set the engine measured in process")
    parser.add_argument("--url", help="measure this OpenAI-compatible server over HTTP")
    parser.add_argument("--vs", help="a peer server to measure with the same workload, for ratios")
    parser.add_argument("--vs-pid", type=int, help="the peer's process id, to report its peak resident memory")
    parser.add_argument("--concurrency", default="",
                        help="HTTP concurrency ladder, e.g. 1,4,8,16,32 (default: none; 16 with --vs)")
    parser.add_argument("--band-repeats", type=int, default=3, help="runs per ladder rung (the median run is kept)")
    parser.add_argument("--invariance-cost", action="store_true",
                        help="also measure the invariant engine against plain torch at batch 1, 4, 8, 16")
    parser.add_argument("--prefix-cache", action="store_true",
                        help="only measure the prefix cache: two servers (on and off), TTFT of a cached system "
                             "prompt, c=16 with distinct prompts, an lm-eval multiple-choice run")
    parser.add_argument("--fleet", action="store_true",
                        help="`batchproof fleet` (2 replicas x 1 thread) against one server: c=16, the Ray hop, memory")
    parser.add_argument("--structured", action="store_true",
                        help="only measure structured output: decode under a JSON schema against free, c=1 and c=16")
    parser.add_argument("--speculative", action="store_true",
                        help="only measure speculative decoding: two servers (on and off, and --vs if given), c=1 "
                             "and c=16 on an editing task, a JSON extraction and free chat")
    parser.add_argument("--neighbour", action="store_true",
                        help="decode at c=1 and c=16, quiet and beside one busy process, ours (--serve or --url) and "
                             "the peer (--vs) in the same rounds")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--write-model", type=Path, metavar="PATH",
                        help="only write a GGUF of random quantized weights in --shape with the default model's "
                             "tokenizer (speed and memory benches only: its text is noise), then exit")
    parser.add_argument("--shape", default="llama-1b",
                        help="--write-model's shapes: llama-1b (the default), llama-3b (Llama 3.2 1B's, 3B's) or "
                             "olmoe-1b-7b (OLMoE-1B-7B's mixture of 64 experts, 8 used)")
    parser.add_argument("--mix", default="q4_k_m",
                        help="--write-model's tensor types, as llama.cpp's quantize picks them: q4_k_m or q4_0")


def run(args: argparse.Namespace) -> int:
    # Each bench is imported only when it runs: building the CLI's parser loads this module.
    if args.write_model:
        return _write_model(args)
    if args.prefix_cache:
        from batchproof.commands.bench import prefix_cache

        return _own_bench(args, "prefix_cache", lambda: prefix_cache.measure(
            args.model, args.serve_arg, args.max_tokens, args.repeats), prefix_cache.report)
    if args.fleet:
        from batchproof.commands.bench import fleet

        return _own_bench(args, "fleet", lambda: fleet.measure(args.model, args.max_tokens, args.repeats),
                          fleet.report)
    if args.structured:
        from batchproof.commands.bench import structured

        return _own_bench(args, "structured", lambda: structured.measure(args.model, args.max_tokens, args.repeats),
                          structured.report)
    if args.speculative:
        from batchproof.commands.bench import speculative

        concurrency = (tuple(int(c) for c in args.concurrency.split(",")) if args.concurrency
                       else speculative.CONCURRENCY)
        return _own_bench(args, "speculative", lambda: speculative.measure(
            args.model, args.serve_arg, args.repeats, args.vs, concurrency), speculative.report)
    if args.neighbour:
        return _neighbour(args)
    from batchproof.commands.bench import speed

    return speed.run(args)


def _neighbour(args: argparse.Namespace) -> int:
    from batchproof.commands.bench import neighbour, servers

    process = None
    try:
        targets = {"ours": args.url.rstrip("/")} if args.url else {}
        if args.serve:
            process, targets["ours"] = servers.start_serve(args.model, args.serve_arg)
        if args.vs:
            targets["peer"] = args.vs.rstrip("/")
        if not targets:
            print("batchproof bench: --neighbour measures --serve, --url or --vs", file=sys.stderr)
            return 2
        return _own_bench(args, "neighbour", lambda: neighbour.measure(targets, args.max_tokens, args.repeats,
                                                                       args.prompt), neighbour.report)
    finally:
        if process is not None:
            servers.stop([process])


def _own_bench(args: argparse.Namespace, key: str, measure: Callable[[], Any], report: Callable[[Any], None]) -> int:
    """A bench of its own servers or engine (the prefix cache's, the fleet's, structured
    output's): measure, print, save under `key`."""
    from batchproof.commands.bench.figures import save

    try:
        figures = measure()
    except RuntimeError as e:
        print(f"batchproof bench: {e}", file=sys.stderr)
        return 1
    report(figures)
    if args.json:
        save(args.json, {key: figures})
    return 0


def _write_model(args: argparse.Namespace) -> int:
    from batchproof.commands.bench import random_model

    shape = random_model.SHAPES.get(args.shape)
    if shape is None or args.mix not in random_model.MIXES:
        print(f"batchproof bench: --shape is one of {', '.join(random_model.SHAPES)} and --mix one of "
              f"{', '.join(random_model.MIXES)} (got {args.shape!r}, {args.mix!r})", file=sys.stderr)
        return 2
    try:
        written = random_model.write(args.write_model, shape, args.mix, tokenizer_from=args.model)
    except OSError as e:
        print(f"batchproof bench: cannot write {args.write_model} ({e.strerror})", file=sys.stderr)
        return 1
    except ValueError as e:  # --model: not a model we know, or not a GGUF we read
        print(f"batchproof bench: {e}", file=sys.stderr)
        return 1
    params = sum(t.num_params for t in written)
    print(f"wrote {args.write_model}: {args.shape} {args.mix}, {params / 1e9:.2f}B parameters, "
          f"{args.write_model.stat().st_size / 1e6:.0f} MB (random weights: for speed and memory only)")
    return 0
