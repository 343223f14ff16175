"""Why llguidance: the two grammar engines on PyPI, measured on both packaged models' vocabularies
(49,152 and 262,144 tokens) with our own token bytes. Run with xgrammar importable (it is not a
dependency: `pip install --target /tmp/xg --no-deps xgrammar apache-tvm-ffi transformers
huggingface_hub safetensors regex`, then `PYTHONPATH=/tmp/xg python bench/grammar_engines.py`).

Per engine and vocabulary: the tokenizer build, a JSON schema's compile, the median and worst
mask per step along a fixed reply, whether two runs (1 and 2 threads) give the same masks, and
which JSON Schema features each enforces or refuses."""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from batchproof.engine.model.gguf.file import read_model_header
from batchproof.engine.model.gguf.tokenizer import gguf_tokenizer
from batchproof.engine.model.known_models import resolve_model
from batchproof.engine.text.tokenizer import Tokenizer

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,11}$"}, "kind": {"enum": ["cat", "dog", "fish"]},
    "toys": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 2, "maxItems": 3},
    "owner": {"type": "object", "properties": {"age": {"type": "integer"}, "vaccinated": {"type": "boolean"}},
              "required": ["age", "vaccinated"], "additionalProperties": False}},
    "required": ["name", "kind", "toys", "owner"], "additionalProperties": False}
REPLY = '{"name": "Luna", "kind": "cat", "toys": ["red wool", "mouse"], "owner": {"age": 34, "vaccinated": true}}'
FEATURES = {
    "pattern": {"type": "string", "pattern": "^a+$"}, "format: date-time": {"type": "string", "format": "date-time"},
    "format: unknown": {"type": "string", "format": "no-such"}, "not": {"not": {"type": "string"}},
    "if/then": {"if": {"type": "string"}, "then": {"minLength": 2}}, "$ref": {"$defs": {"a": {"type": "integer"}},
                                                                            "$ref": "#/$defs/a"},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "uniqueItems": {"type": "array", "uniqueItems": True},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "minimum/maximum": {"type": "integer", "minimum": 3, "maximum": 7},
    "multipleOf": {"type": "integer", "multipleOf": 3}, "look-around pattern": {"type": "string", "pattern": "(?=a)a"},
}


def our_tokens(model: str) -> Tokenizer:
    metadata, _ = read_model_header(resolve_model(Path(model) if model else None))
    return gguf_tokenizer(metadata)


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, threads: int) -> None:
        from batchproof.engine.grammar.vocabulary import grammar_tokenizer
        self.tokenizer, self.llt = tokenizer, grammar_tokenizer(tokenizer)

    def compile(self, schema: dict):
        from llguidance import LLMatcher

        from batchproof.engine.grammar import compile as grammars
        grammar = grammars.json_schema(schema).grammar
        matcher = LLMatcher(self.llt, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def mask(self, matcher) -> torch.Tensor:
        from batchproof.engine.grammar.state import unpack_mask
        return unpack_mask(matcher.compute_bitmask(), self.tokenizer.vocab_size)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, threads: int) -> None:
        import xgrammar
        self.xg, self.vocab = xgrammar, tokenizer.vocab_size
        info = xgrammar.TokenizerInfo([tokenizer.decode_bytes(i) for i in range(self.vocab)],
                                      vocab_type=xgrammar.VocabType.RAW, vocab_size=self.vocab,
                                      stop_token_ids=sorted(tokenizer.ids.end_of_turn_ids))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads)

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(", ", ": "), strict_mode=True)
        return self.xg.GrammarMatcher(compiled)

    def mask(self, matcher) -> torch.Tensor:
        bitmask = self.xg.allocate_token_bitmask(1, self.vocab)
        matcher.fill_next_token_bitmask(bitmask)
        packed = bitmask[0].numpy().tobytes()
        from batchproof.engine.grammar.state import unpack_mask
        return unpack_mask(packed, self.vocab)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


def walk(engine, tokenizer: Tokenizer) -> tuple[list[float], list[torch.Tensor]]:
    """Masks along REPLY, tokenized greedily under the mask (the longest allowed token that
    continues the text), so both engines walk the same path."""
    matcher, times, masks, pos, data = engine.compile(SCHEMA), [], [], 0, REPLY.encode()
    while pos < len(data):
        started = time.perf_counter()
        mask = engine.mask(matcher)
        times.append(time.perf_counter() - started)
        masks.append(mask)
        best = max((i for i in mask.nonzero().flatten().tolist()
                    if tokenizer.decode_bytes(i) and data.startswith(tokenizer.decode_bytes(i), pos)),
                   key=lambda i: len(tokenizer.decode_bytes(i)), default=None)
        if best is None or not engine.accept(matcher, best):
            raise RuntimeError(f"{engine.name}: stuck at byte {pos} of the reply")
        pos += len(tokenizer.decode_bytes(best))
    return times, masks


def features(engine) -> dict[str, str]:
    verdicts = {}
    for name, schema in FEATURES.items():
        try:
            engine.compile(schema)
            verdicts[name] = "enforced"
        except Exception as e:  # each engine raises its own kinds
            verdicts[name] = f"refused ({str(e).splitlines()[0][:60]})"
    return verdicts


def main() -> None:
    results = {}
    for model in ("", "gemma3-270m"):
        tokenizer = our_tokens(model)
        for kind in (Llguidance, Xgrammar):
            started = time.perf_counter()
            try:
                engine = kind(tokenizer, 1)
            except ImportError:
                continue
            build = time.perf_counter() - started
            started = time.perf_counter()
            engine.compile(SCHEMA)
            compile_s = time.perf_counter() - started
            times, masks = walk(engine, tokenizer)
            _, again = walk(kind(tokenizer, 2), tokenizer)
            row = {"vocab": tokenizer.vocab_size, "tokenizer_build_s": round(build, 3),
                   "schema_compile_ms": round(compile_s * 1e3, 1), "steps": len(times),
                   "mask_median_ms": round(statistics.median(times) * 1e3, 3), "mask_max_ms": round(max(times) * 1e3, 3),
                   "same_masks_1_and_2_threads": all(torch.equal(a, b) for a, b in zip(masks, again)),
                   "features": features(engine)}
            results[f"{kind.name} @ {tokenizer.vocab_size}"] = row
            print(kind.name, tokenizer.vocab_size, {k: v for k, v in row.items() if k != "features"}, file=sys.stderr)
    json.dump(results, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
