"""`batchproof generate`: one chat reply from the engine, as text or as JSON with logprobs."""

import argparse
import math
import sys
from pathlib import Path

from batchproof.common.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the user message")
    parser.add_argument("--model", type=Path, help="GGUF file or packaged model name (default: smollm2-135m)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy [default: 0]")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--top-logprobs", type=int, default=0, help="alternatives per token in --json output")
    parser.add_argument("--ignore-eos", action="store_true", help="never end the turn before --max-tokens")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto")
    parser.add_argument("--json", action="store_true", help="print one JSON object with ids and logprobs")


def token_json(tokenizer, token_id: int) -> dict:
    raw = tokenizer.decode_bytes(token_id)
    return {"id": token_id, "token": raw.decode("utf-8", errors="replace"), "bytes": list(raw)}


def run(args: argparse.Namespace) -> int:
    from batchproof.engine.config import EngineConfig
    from batchproof.engine.engine import Engine
    from batchproof.engine.model.errors import load_error_message
    from batchproof.engine.sampling.params import SamplingParams, SamplingParamsError

    try:
        params = SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens,
                                ignore_eos=args.ignore_eos, top_logprobs=args.top_logprobs if args.json else None)
        engine = Engine(EngineConfig(model_path=args.model, device=args.device, max_batch=1, batch_window_ms=0))
    except (SamplingParamsError, ConfigError) as e:
        print(f"batchproof generate: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        message = load_error_message(e)
        if message is None:
            raise
        print(f"batchproof generate: {message}", file=sys.stderr)
        return 2
    try:  # a model without a chat template says so (NoChatTemplate is a ValueError)
        prompt_ids = engine.chat_prompt_ids([{"role": "user", "content": args.prompt}])
        deltas = engine.generate({"cli": (prompt_ids, params)})["cli"]
    except ValueError as e:
        print(f"batchproof generate: {e}", file=sys.stderr)
        return 2
    text = "".join(d.text for d in deltas)
    if deltas[-1].error:
        print(f"batchproof generate: {deltas[-1].error}", file=sys.stderr)
        return 1
    if not args.json:
        print(text)
        return 0
    from batchproof.common.wire import dumps, wire_logprob

    tokens = []
    for record in (r for d in deltas for r in d.records):
        entry = token_json(engine.tokenizer, record.token_id) | {"logprob": wire_logprob(record.logprob)}
        entry["top"] = [{"id": t.token_id, "token": engine.tokenizer.token_text(t.token_id),
                         "logit": t.logit if math.isfinite(t.logit) else None, "logprob": wire_logprob(t.logprob)}
                        for t in record.top]
        tokens.append(entry)
    print(dumps({"text": text, "finish_reason": deltas[-1].finish_reason, "prompt_ids": prompt_ids,
                 "tokens": tokens}))
    return 0
